/**
 * A real OCI registry for tests: Debian's docker-registry (CNCF distribution 2.8) with a temp
 * config on loopback, filesystem storage in a temp dir, and htpasswd (bcrypt) auth when asked.
 * It can be killed and started again on the same port and storage (a registry restart).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes, sign } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
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
  if (!which('openssl')) return 'registry tests need openssl (for the token service certificate; Debian package openssl)';
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

/**
 * The registry's token service for Bearer auth (the Docker/OCI token scheme): a loopback HTTP
 * server that checks Basic credentials and answers a JWT (ES256, signed with a key whose
 * self-signed certificate the registry trusts, sent in the x5c header) granting the scope asked.
 */
export interface TokenService {
  realm: string;
  certFile: string;
  /** The scopes asked for, in order (`repository:team/x:pull,push`). */
  scopes: string[];
  close(): Promise<void>;
}

const ISSUER = 'dsec-test-issuer';
const SERVICE = 'dsec-test-registry';

async function startTokenService(dir: string, credentials: { username: string; password: string }): Promise<TokenService> {
  const keyFile = join(dir, 'token.key');
  const certFile = join(dir, 'token.crt');
  const r = spawnSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:prime256v1',
      '-nodes',
      '-keyout',
      keyFile,
      '-out',
      certFile,
      '-days',
      '1',
      '-subj',
      '/CN=dsec-test-token',
    ],
    { encoding: 'utf8' },
  );
  if (r.status !== 0) throw new Error(`openssl failed: ${r.stderr}`);
  const key = readFileSync(keyFile, 'utf8');
  const certDer = readFileSync(certFile, 'utf8').replace(/-----[^-]+-----|\s/g, '');
  const scopes: string[] = [];
  const b64 = (v: unknown): string => Buffer.from(JSON.stringify(v)).toString('base64url');
  const server = createHttpServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    const expected = `Basic ${Buffer.from(`${credentials.username}:${credentials.password}`).toString('base64')}`;
    if (req.headers.authorization !== expected) {
      res.writeHead(401, { 'content-type': 'application/json' }).end(JSON.stringify({ details: 'incorrect username or password' }));
      return;
    }
    const scope = url.searchParams.get('scope') ?? '';
    scopes.push(scope);
    const [type, name, actions] = scope.split(':');
    const now = Math.floor(Date.now() / 1000);
    const claims = {
      iss: ISSUER,
      sub: credentials.username,
      aud: url.searchParams.get('service'),
      exp: now + 300,
      nbf: now - 10,
      iat: now,
      jti: randomBytes(8).toString('hex'),
      access: type ? [{ type, name, actions: (actions ?? '').split(',') }] : [],
    };
    const input = `${b64({ typ: 'JWT', alg: 'ES256', x5c: [certDer] })}.${b64(claims)}`;
    const sig = sign('sha256', Buffer.from(input), { key, dsaEncoding: 'ieee-p1363' }).toString('base64url');
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ token: `${input}.${sig}`, expires_in: 300 }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  return {
    realm: `http://127.0.0.1:${port}/token`,
    certFile,
    scopes,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

/** `deletes: false` leaves distribution's deletes off (its default): DELETE answers 405. */
export async function startTestRegistry(
  opts: { auth?: boolean | 'token'; deletes?: boolean } = {},
): Promise<TestRegistry & { tokens?: TokenService }> {
  const dir = mkdtempSync('/var/tmp/dsec-registry-');
  const port = await freePort();
  const credentials = opts.auth ? { username: 'trainer', password: `pw-${Math.random().toString(36).slice(2)}` } : undefined;
  const tokens = opts.auth === 'token' ? await startTokenService(dir, credentials!) : undefined;
  if (credentials && !tokens) {
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
      `    enabled: ${opts.deletes ?? true}`,
      'http:',
      `  addr: 127.0.0.1:${port}`,
      ...(tokens
        ? [
            'auth:',
            '  token:',
            `    realm: ${tokens.realm}`,
            `    service: ${SERVICE}`,
            `    issuer: ${ISSUER}`,
            `    rootcertbundle: ${tokens.certFile}`,
          ]
        : credentials
          ? ['auth:', '  htpasswd:', '    realm: dsec-test', `    path: ${join(dir, 'htpasswd')}`]
          : []),
      '',
    ].join('\n'),
  );
  let child: ChildProcess | undefined;
  const log: string[] = [];
  const url = `http://127.0.0.1:${port}`;
  const reg: TestRegistry & { tokens?: TokenService } = {
    ...(tokens ? { tokens } : {}),
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
      const exited = new Promise<never>((_, reject) =>
        c.once('exit', (code) => reject(new Error(`docker-registry exited (${code}): ${log.slice(-5).join('\n')}`))),
      );
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
      await tokens?.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
  await reg.start();
  return reg;
}
