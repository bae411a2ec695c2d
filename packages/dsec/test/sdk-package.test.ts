/**
 * The SDK as a user gets it: `npm pack` of packages/sdk, installed with one `npm install` into a
 * scratch project under /var/tmp (outside the repository, so nothing resolves through the
 * workspace), then used from plain JavaScript and type-checked from TypeScript against a real
 * server. Dependencies come from the npm cache the repository's own install filled
 * (--prefer-offline), so the test needs the registry only when that cache is empty.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { integrationSkipReason, startTestServer, type TestServer } from './helpers/server.js';

const REPO = join(dirname(fileURLToPath(import.meta.url)), '../../../..');
const SDK_DIR = join(REPO, 'packages/sdk');

/** Runs a command to completion without blocking the event loop: the server under test runs in this process. */
function run(cmd: string, args: string[], opts: { cwd: string; env?: Record<string, string> }): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd: opts.cwd, env: { ...process.env, ...opts.env }, stdio: ['ignore', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => err.push(d));
    const guard = setTimeout(() => child.kill('SIGKILL'), 300_000);
    child.on('error', reject);
    child.on('close', (code, signal) => {
      clearTimeout(guard);
      const stdout = Buffer.concat(out).toString('utf8');
      if (code === 0) resolve(stdout);
      else reject(new Error(`${cmd} ${args.join(' ')} failed (${code ?? signal}):\n${stdout}\n${Buffer.concat(err).toString('utf8')}`));
    });
  });
}

const npmSkip = spawnSync('npm', ['--version'], { encoding: 'utf8' }).status === 0 ? undefined : 'needs npm on PATH';

describe('the packed SDK installed outside the repository', { skip: integrationSkipReason() ?? npmSkip, timeout: 600_000 }, () => {
  let server: TestServer;
  let scratch: string;
  let tarball: string;

  before(async () => {
    server = await startTestServer();
    scratch = mkdtempSync('/var/tmp/dsec-sdk-pkg-');
    const packed = JSON.parse(await run('npm', ['pack', '--json', '--pack-destination', scratch], { cwd: SDK_DIR })) as {
      filename: string;
      files: { path: string }[];
    }[];
    tarball = join(scratch, packed[0]!.filename);
  });
  after(async () => {
    if (scratch?.startsWith('/var/tmp/dsec-sdk-pkg-')) rmSync(scratch, { recursive: true, force: true });
    await server?.close();
  });

  test('the tarball holds compiled JS and types only: no tests, no sources, no maps', async () => {
    const files = (await run('tar', ['-tzf', tarball], { cwd: scratch })).trim().split('\n');
    assert.ok(files.includes('package/dist/index.js') && files.includes('package/dist/index.d.ts'), files.join('\n'));
    assert.ok(files.includes('package/dist/schema/index.d.ts'));
    const stray = files.filter((f) => !/^package\/(package\.json|README\.md|dist\/.+\.(js|d\.ts))$/.test(f) || /\.test\./.test(f));
    assert.deepEqual(stray, []);
    const manifest = JSON.parse(await run('tar', ['-xzOf', tarball, 'package/package.json'], { cwd: scratch })) as {
      dependencies: Record<string, string>;
    };
    // @types/ws too: the SDK's own .d.ts files (ports) name ws's types, so a TypeScript user's
    // type check needs them whatever their own dependencies are.
    assert.deepEqual(Object.keys(manifest.dependencies).sort(), ['@types/ws', 'typebox', 'ws'], 'its runtime dependencies are declared');
  });

  test('one npm install, then a sandbox from plain JavaScript and a type-checked TypeScript file', async () => {
    const project = join(scratch, 'project');
    mkdirSync(project);
    writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'scratch', private: true, type: 'module' }));
    await run('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error', tarball], { cwd: project });
    const installed = JSON.parse(readFileSync(join(project, 'node_modules/@dsec/sdk/package.json'), 'utf8')) as { name: string };
    assert.equal(installed.name, '@dsec/sdk');

    writeFileSync(
      join(project, 'main.mjs'),
      `import { Sandbox, InvalidRequestError } from '@dsec/sdk';
const sb = await Sandbox.create({ labels: { via: 'sdk-package' } });
try {
  await sb.files.write('/tmp/in.txt', 'packaged\\n');
  const r = await sb.commands.run('cat /tmp/in.txt');
  let refused = false;
  try { await sb.commands.run(123); } catch (e) { refused = e instanceof InvalidRequestError; }
  console.log(JSON.stringify({ exitCode: r.exitCode, stdout: r.stdout, refused }));
} finally {
  await sb.kill();
}
`,
    );
    const out = await run(process.execPath, ['main.mjs'], { cwd: project, env: { DSEC_URL: server.url, DSEC_API_KEY: server.apiKey } });
    assert.deepEqual(JSON.parse(out), { exitCode: 0, stdout: 'packaged\n', refused: true });

    writeFileSync(
      join(project, 'main.ts'),
      `import { Sandbox, type ExecResult } from '@dsec/sdk';
import type { CreateSandboxRequest } from '@dsec/sdk/schema';
const spec: Omit<CreateSandboxRequest, 'image'> = { resources: { memoryMiB: 64 } };
export async function step(): Promise<ExecResult> {
  const sb = await Sandbox.create({ image: 'busybox', ...spec });
  try { return await sb.commands.run(['echo', 'typed'], { timeoutMs: 5_000 }); } finally { await sb.kill(); }
}
`,
    );
    const tsc = join(REPO, 'node_modules/typescript/bin/tsc');
    await run(
      process.execPath,
      [
        tsc,
        '--noEmit',
        '--strict',
        '--module',
        'nodenext',
        '--moduleResolution',
        'nodenext',
        '--target',
        'es2022',
        '--skipLibCheck',
        'false',
        '--types',
        'node',
        '--typeRoots',
        join(REPO, 'node_modules/@types'),
        'main.ts',
      ],
      {
        cwd: project,
      },
    );
  });
});
