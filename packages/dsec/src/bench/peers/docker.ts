import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tryUnmount } from '../../edge/node/layer-mounts.js';
import { removeCgroupTree } from '../../host/cgroups.js';
import { which } from '../../host/doctor.js';
import { mountsUnder } from '../../host/mounts.js';
import { runTool } from '../../host/run-tool.js';
import { ensurePackages } from './apt.js';
import { CliPeer, importRootfs, limitFlags, type CliPeerSetup } from './cli-peer.js';

const IMAGE = 'dsec-bench-busybox:latest';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A dockerd this benchmark started, and how to stop it: by its own PID, never by name. */
class Dockerd {
  constructor(
    readonly child: ChildProcess,
    readonly logFile: string,
    readonly execRoot: string,
  ) {}

  exited(): boolean {
    return this.child.exitCode !== null || this.child.signalCode !== null;
  }

  logTail(lines = 12): string {
    try {
      return readFileSync(this.logFile, 'utf8').trim().split('\n').slice(-lines).join('\n');
    } catch {
      return '(no dockerd log)';
    }
  }

  async stop(): Promise<void> {
    if (!this.exited()) {
      const done = new Promise<void>((r) => this.child.once('exit', () => r()));
      this.child.kill('SIGTERM');
      await Promise.race([done, sleep(30_000)]);
      if (!this.exited()) {
        this.child.kill('SIGKILL');
        await Promise.race([done, sleep(5_000)]);
      }
    }
    // dockerd stops the containerd it started; if dockerd died first, that containerd is ours to end.
    const pidFile = join(this.execRoot, 'containerd', 'containerd.pid');
    if (existsSync(pidFile)) {
      const pid = Number(readFileSync(pidFile, 'utf8'));
      try {
        if (pid > 1) process.kill(pid, 'SIGTERM');
      } catch {
        // already gone
      }
    }
  }
}

/**
 * docker with a dockerd of its own: own socket, data root, exec root and pid file under the
 * run's temp dir, no iptables and no bridge (there is no network here; containers run with
 * --network none), cgroupfs. The image is imported from the same rootfs dsec runs.
 */
export async function startDocker(opts: CliPeerSetup): Promise<CliPeer> {
  await ensurePackages(['docker.io'], opts.say);
  const dockerdBin = which('dockerd');
  if (!dockerdBin) throw new Error('dockerd is not on PATH after apt-get install docker.io');
  // Debian's CLI matches its daemon; another `docker` earlier on PATH may be a newer client only.
  const cli = existsSync('/usr/bin/docker') ? '/usr/bin/docker' : which('docker');
  if (!cli) throw new Error('no docker CLI found after apt-get install docker.io');

  const { dir } = opts;
  const dataRoot = join(dir, 'data');
  const execRoot = join(dir, 'exec');
  const socket = join(dir, 'docker.sock');
  const cliConfig = join(dir, 'cli');
  for (const d of [dataRoot, execRoot, cliConfig]) mkdirSync(d, { recursive: true });
  writeFileSync(join(dir, 'daemon.json'), '{}\n');
  const logFile = join(dir, 'dockerd.log');
  const log = openSync(logFile, 'a');
  const child = spawn(
    dockerdBin,
    [
      '--config-file',
      join(dir, 'daemon.json'),
      '--iptables=false',
      '--ip-masq=false',
      '--bridge=none',
      '--data-root',
      dataRoot,
      '--exec-root',
      execRoot,
      '--pidfile',
      join(dir, 'dockerd.pid'),
      '-H',
      `unix://${socket}`,
      '--exec-opt',
      'native.cgroupdriver=cgroupfs',
      '--cgroup-parent',
      `/${opts.cgroupParent}`,
      '--storage-driver',
      'overlay2',
      '--log-level',
      'warn',
    ],
    // Its own process group: a Ctrl-C meant for the benchmark must not stop dockerd before cleanup does.
    { stdio: ['ignore', log, log], detached: true },
  );
  closeSync(log);
  const daemon = new Dockerd(child, logFile, execRoot);
  child.on('error', () => {});

  const env = { ...process.env, DOCKER_CONFIG: cliConfig };
  const globalArgs = ['-H', `unix://${socket}`];
  const onClose = async (): Promise<void> => {
    await runTool(cli, [...globalArgs, 'image', 'rm', '-f', IMAGE], { env });
    await daemon.stop();
    for (const m of mountsUnder(dir).reverse()) tryUnmount(m.mountPoint);
    removeCgroupTree(opts.cgroupParent);
  };

  let version = '';
  const deadline = performance.now() + 60_000;
  while (performance.now() < deadline) {
    if (daemon.exited()) {
      await onClose();
      throw new Error(`dockerd exited at start (code ${child.exitCode ?? child.signalCode}):\n${daemon.logTail()}`);
    }
    const r = await runTool(cli, [...globalArgs, 'version', '--format', '{{.Client.Version}} {{.Server.Version}}'], { env });
    if (r.code === 0) {
      const [client, server] = r.stdout.trim().split(' ');
      version = `Docker ${server} (client ${client}), runc`;
      break;
    }
    await sleep(250);
  }
  if (!version) {
    await onClose();
    throw new Error(`dockerd did not answer on ${socket} within 60 s:\n${daemon.logTail()}`);
  }
  const runcVersion = (await runTool('runc', ['--version'])).stdout.split('\n')[0]?.replace(/^runc version /, '') ?? '';
  if (runcVersion) version += ` ${runcVersion}`;

  const peer = new CliPeer(
    {
      name: 'docker',
      description: `docker run -d --network none --memory ${opts.limits.memoryMiB}m (own dockerd + containerd, runc, cgroupfs, overlay2, shim per container)`,
      version,
      bin: cli,
      globalArgs,
      env,
      image: IMAGE,
      runArgs: limitFlags(opts.limits),
      cgroupParent: opts.cgroupParent,
      rmArgs: [],
    },
    onClose,
  );
  return importRootfs(peer, await opts.rootfsTar(), IMAGE);
}
