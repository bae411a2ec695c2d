/**
 * A real OCI registry for tests: Debian's docker-registry (CNCF distribution 2.8) with a temp
 * config on loopback, filesystem storage in a temp dir, and htpasswd (bcrypt) auth when asked.
 * It can be killed and started again on the same port and storage (a registry restart).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { which } from '../../src/host/doctor.js';

export interface TestRegistry {
  /** `127.0.0.1:PORT`: the host part of a REF. */
  host: string;
  url: string;
  dir: string;
  credentials: { username: string; password: string } | undefined;
  /** How many times the registry process was started. */
  starts: number;
  /** Every request line the registry logged (its access log), oldest first. */
  requests(): string[];
  /** SIGKILL, as a crash or a node restart would. */
  kill(): Promise<void>;
  start(): Promise<void>;
  close(): Promise<void>;
}

/** Why registry tests cannot run here, or undefined. */
export function registrySkipReason(): string | undefined {
  if (!which('docker-registry')) return 'registry tests need docker-registry (Debian package docker-registry; ./scripts/setup installs it)';
  if (!which('htpasswd')) return 'registry tests need htpasswd (Debian package apache2-utils; ./scripts/setup installs it)';
  return undefined;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

export async function startTestRegistry(opts: { auth?: boolean } = {}): Promise<TestRegistry> {
  const dir = mkdtempSync('/var/tmp/dsec-registry-');
  const port = await freePort();
  const credentials = opts.auth ? { username: 'trainer', password: `pw-${Math.random().toString(36).slice(2)}` } : undefined;
  if (credentials) {
    // distribution accepts bcrypt entries only.
    const r = spawnSync('htpasswd', ['-Bbn', credentials.username, credentials.password], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`htpasswd failed: ${r.stderr}`);
    writeFileSync(join(dir, 'htpasswd'), r.stdout);
  }
  writeFileSync(
    join(dir, 'config.yml'),
    [
      'version: 0.1',
      'log:',
      '  level: info',
      '  formatter: text',
      'storage:',
      '  filesystem:',
      `    rootdirectory: ${join(dir, 'storage')}`,
      '  delete:',
      '    enabled: true',
      'http:',
      `  addr: 127.0.0.1:${port}`,
      ...(credentials ? ['auth:', '  htpasswd:', '    realm: dsec-test', `    path: ${join(dir, 'htpasswd')}`] : []),
      '',
    ].join('\n'),
  );
  let child: ChildProcess | undefined;
  const log: string[] = [];
  const url = `http://127.0.0.1:${port}`;
  const reg: TestRegistry = {
    host: `127.0.0.1:${port}`,
    url,
    dir,
    credentials,
    starts: 0,
    requests: () => log.filter((l) => /"(GET|HEAD|PUT|POST|PATCH|DELETE) \/v2\//.test(l)),
    async start() {
      const c = spawn('docker-registry', ['serve', join(dir, 'config.yml')], { stdio: ['ignore', 'pipe', 'pipe'] });
      child = c;
      reg.starts++;
      let tail = '';
      const onData = (b: Buffer): void => {
        tail += b.toString();
        const lines = tail.split('\n');
        tail = lines.pop()!;
        log.push(...lines);
      };
      c.stdout!.on('data', onData);
      c.stderr!.on('data', onData);
      const exited = new Promise<never>((_, reject) => c.once('exit', (code) => reject(new Error(`docker-registry exited (${code}): ${log.slice(-5).join('\n')}`))));
      exited.catch(() => {});
      for (let i = 0; ; i++) {
        const up = await Promise.race([
          fetch(`${url}/v2/`).then(
            (r) => r.status === 200 || r.status === 401,
            () => false,
          ),
          exited,
        ]);
        if (up) return;
        if (i > 200) throw new Error(`docker-registry did not answer on ${url}: ${log.slice(-5).join('\n')}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    },
    async kill() {
      const c = child;
      if (!c || c.exitCode !== null || c.signalCode !== null) return;
      const gone = new Promise((r) => c.once('exit', r));
      c.kill('SIGKILL');
      await gone;
    },
    async close() {
      await reg.kill();
      rmSync(dir, { recursive: true, force: true });
    },
  };
  await reg.start();
  return reg;
}
