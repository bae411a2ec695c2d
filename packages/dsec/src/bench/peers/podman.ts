import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tryUnmount } from '../../edge/node/layer-mounts.js';
import { CGROUP_ROOT, removeCgroupTree } from '../../host/cgroups.js';
import { which } from '../../host/doctor.js';
import { mountsUnder } from '../../host/mounts.js';
import { runTool } from '../../host/run-tool.js';
import { ensurePackages } from './apt.js';
import { CliPeer, importRootfs, limitFlags, type CliPeerSetup } from './cli-peer.js';

const IMAGE = 'localhost/dsec-bench-busybox:latest';

/**
 * podman on a private store under the run's temp dir, configured for this host: cgroupfs (no
 * systemd here), events to a file (no journald), and container ulimits this root can grant
 * (it lacks CAP_SYS_RESOURCE, so podman's default nofile=1048576 fails). The image is the very
 * rootfs dsec runs, imported from a tar: nothing comes from a registry.
 */
export async function startPodman(opts: CliPeerSetup): Promise<CliPeer> {
  await ensurePackages(['podman'], opts.say);
  const bin = which('podman');
  if (!bin) throw new Error('podman is not on PATH after apt-get install podman');
  const { dir } = opts;
  const storage = join(dir, 'storage');
  const run = join(dir, 'run');
  const tmp = join(dir, 'tmp');
  for (const d of [storage, run, tmp]) mkdirSync(d, { recursive: true });
  writeFileSync(
    join(dir, 'containers.conf'),
    [
      '[containers]',
      'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]',
      '[engine]',
      'cgroup_manager = "cgroupfs"',
      'events_logger = "file"',
      'runtime = "crun"',
      `tmp_dir = "${tmp}"`,
      '',
    ].join('\n'),
  );
  writeFileSync(
    join(dir, 'storage.conf'),
    ['[storage]', 'driver = "overlay"', `graphroot = "${storage}"`, `runroot = "${run}"`, ''].join('\n'),
  );
  writeFileSync(join(dir, 'registries.conf'), 'unqualified-search-registries = []\n');
  const env = {
    ...process.env,
    CONTAINERS_CONF: join(dir, 'containers.conf'),
    CONTAINERS_STORAGE_CONF: join(dir, 'storage.conf'),
    CONTAINERS_REGISTRIES_CONF: join(dir, 'registries.conf'),
  };
  const globalArgs = [
    '--root',
    storage,
    '--runroot',
    run,
    '--tmpdir',
    tmp,
    '--cgroup-manager',
    'cgroupfs',
    '--events-backend',
    'file',
    '--runtime',
    'crun',
  ];
  const libpodParentExisted = existsSync(join(CGROUP_ROOT, 'memory', 'libpod_parent'));

  const version = await runTool(bin, ['--version'], { env });
  const peer = new CliPeer(
    {
      name: 'podman',
      description: `podman run -d --network none --memory ${opts.limits.memoryMiB}m (crun, cgroupfs, overlay storage, conmon per container)`,
      version: version.stdout.trim() || 'unknown',
      bin,
      globalArgs,
      env,
      image: IMAGE,
      runArgs: [...limitFlags(opts.limits), `--cgroup-parent=/${opts.cgroupParent}`],
      cgroupParent: opts.cgroupParent,
      rmArgs: ['--time=0'],
    },
    async () => {
      await runTool(bin, [...globalArgs, 'rmi', '-af'], { env });
      // The overlay driver bind-mounts its own home and each container's merged dir.
      for (const m of mountsUnder(dir).reverse()) tryUnmount(m.mountPoint);
      removeCgroupTree(opts.cgroupParent);
      if (!libpodParentExisted) removeCgroupTree('libpod_parent');
    },
  );
  return importRootfs(peer, await opts.rootfsTar(), IMAGE);
}
