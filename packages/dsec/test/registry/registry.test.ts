/**
 * dsec images through a real OCI registry (Debian's docker-registry, htpasswd auth, on loopback):
 * push from one data dir, pull into another (two clusters), a sandbox from the pulled image;
 * ranged blob reads; a registry restarted in the middle of a pull; wrong credentials.
 * Why one long file (over 500 lines): the tests share one registry process and two dsec data dirs
 * (a push's image is the next test's pull), which a split would set up again per file.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { gzipSync } from 'node:zlib';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { AuthError, Image, Sandbox } from '@dsec/sdk';
import { ImageStore } from '../../src/image/image-store.js';
import { LayerStore } from '../../src/image/layer-store.js';
import { pullImage } from '../../src/image/registry/image-pull.js';
import { pushImage } from '../../src/image/registry/image-push.js';
import { buildBusyboxImage } from '../../src/image/builders/busybox.js';
import { CHUNK_FUSE_BINARY } from '../../src/host/native-helpers.js';
import { compileOptions } from '../../src/config/options.js';
import { startControlPlane } from '../../src/runtime/all-in-one.js';
import { startEdgeDaemon, type RunningEdgeDaemon } from '../../src/runtime/edge-daemon.js';
import { RegistryAuthError, RegistryClient } from '../../src/image/registry/registry-client.js';
import { parseRegistryRef } from '../../src/image/registry/registry-ref.js';
import { sha256Digest } from '../../src/image/registry/dsec-artifact.js';
import { ustar } from '../state/fixtures/oci.js';
import { buildTestImage } from '../helpers/images.js';
import { registrySkipReason, startTestRegistry, type TestRegistry, type TokenService } from '../helpers/registry.js';
import {
  assertCleanAndRemove,
  integrationSkipReason,
  makeDataDir,
  newEdgeId,
  startDsec,
  startTestServer,
  type TestServer,
} from '../helpers/server.js';

const CLI = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));

function runCli(args: string[], env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], {
      env: { PATH: process.env['PATH'] ?? '/usr/bin:/bin', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const guard = setTimeout(() => child.kill('SIGKILL'), 120_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(guard);
      resolve({ code, stdout, stderr });
    });
  });
}

describe('OCI registry', { skip: integrationSkipReason() ?? registrySkipReason(), timeout: 300_000 }, () => {
  let registry: TestRegistry;
  let server: TestServer;
  let creds: Record<string, string>;
  const dirsToRemove: { dataDir: string; edgeId: string }[] = [];

  before(async () => {
    registry = await startTestRegistry({ auth: true });
    creds = { DSEC_REGISTRY_USER: registry.credentials!.username, DSEC_REGISTRY_PASSWORD: registry.credentials!.password };
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
    for (const d of dirsToRemove) await assertCleanAndRemove(d.dataDir, d.edgeId);
    await registry?.close();
  });

  test('push from one data dir, pull by tag into another: same image id, and a sandbox runs from it', async () => {
    const marker = `pushed-${randomBytes(6).toString('hex')}`;
    const built = await buildTestImage(server.dsec.images, 'regtest:v1', (root) => writeFileSync(`${root}/marker`, marker), {
      env: ['PATH=/bin', `MARKER=${marker}`],
    });
    const busybox = server.dsec.images.get(server.dsec.images.resolve('busybox')!)!;
    // One image of two layers: busybox below, the marker layer on top.
    const stacked = server.dsec.images.put({
      layers: [busybox.layers[0]!, ...server.dsec.images.get(built.id)!.layers],
      config: server.dsec.images.get(built.id)!.config,
    });
    server.dsec.images.tag('regtest:v1', stacked);
    const ref = `${registry.host}/team/regtest:v1`;

    const push = await runCli(['image', 'push', ref, '--data-dir', server.dataDir, '--json'], creds);
    assert.equal(push.code, 0, push.stderr);
    const pushed = JSON.parse(push.stdout) as { digest: string; layers: number; uploadedLayers: number };
    assert.equal(pushed.layers, 2);
    assert.equal(pushed.uploadedLayers, 2);
    // A second push uploads nothing (HEAD finds every blob) and names the same manifest.
    const again = JSON.parse((await runCli(['image', 'push', ref, '--data-dir', server.dataDir, '--json'], creds)).stdout) as {
      digest: string;
      uploadedLayers: number;
    };
    assert.equal(again.uploadedLayers, 0);
    assert.equal(again.digest, pushed.digest);

    // The registry holds an OCI manifest with dsec's media types.
    const client = new RegistryClient(parseRegistryRef(ref), { credentials: registry.credentials });
    const m = await client.getManifest('v1');
    assert.ok(m);
    assert.equal(sha256Digest(m.bytes), pushed.digest);
    const manifest = JSON.parse(m.bytes.toString()) as {
      artifactType: string;
      config: { mediaType: string };
      layers: { mediaType: string; digest: string }[];
    };
    assert.equal(manifest.artifactType, 'application/vnd.dsec.image.v1');
    assert.equal(manifest.config.mediaType, 'application/vnd.dsec.image.config.v1+json');
    assert.deepEqual(
      manifest.layers.map((l) => l.mediaType),
      ['application/vnd.dsec.image.layer.v1.erofs', 'application/vnd.dsec.image.layer.v1.erofs'],
    );
    assert.deepEqual(
      manifest.layers.map((l) => l.digest),
      server.dsec.images.get(stacked)!.layers,
    );

    // The second cluster: a fresh data dir, pulled into, then a dsec started on it.
    const dataDir = makeDataDir();
    const edgeId = newEdgeId();
    dirsToRemove.push({ dataDir, edgeId });
    const pull = await runCli(['image', 'pull', ref, '--data-dir', dataDir, '--json'], creds);
    assert.equal(pull.code, 0, pull.stderr);
    const pulled = JSON.parse(pull.stdout) as { id: string; digest: string; name: string; fetchedLayers: number };
    assert.equal(pulled.id, stacked, 'the pulled image has the id it had where it was pushed');
    assert.equal(pulled.digest, pushed.digest);
    assert.equal(pulled.name, 'regtest:v1');
    assert.equal(pulled.fetchedLayers, 2);
    // Pulling by digest gives the same image and fetches nothing more.
    const byDigest = await runCli(
      ['image', 'pull', `${registry.host}/team/regtest@${pushed.digest}`, '--name', 'pinned', '--data-dir', dataDir, '--json'],
      creds,
    );
    assert.equal(byDigest.code, 0, byDigest.stderr);
    assert.equal((JSON.parse(byDigest.stdout) as { id: string; fetchedLayers: number }).fetchedLayers, 0);

    const dsec = await startDsec(dataDir, { edgeId });
    try {
      const sb = await Sandbox.create({ url: dsec.url, apiKey: dsec.apiKey, image: 'regtest:v1' });
      const r = await sb.commands.run('cat /marker; echo " $MARKER"');
      assert.equal(r.exitCode, 0, r.stderr);
      assert.equal(r.stdout, `${marker} ${marker}\n`);
      await sb.kill();
    } finally {
      await dsec.close({ killAll: true });
    }
  });

  test('ranged blob reads give exactly the bytes asked for; HEAD gives the size; an unknown blob is absent', async () => {
    const id = server.dsec.images.resolve('busybox')!;
    const digest = server.dsec.images.get(id)!.layers[0]!;
    const bytes = readFileSync(server.dsec.images.layers.path(digest));
    const ref = parseRegistryRef(`${registry.host}/team/ranges:v1`);
    const r = await runCli(['image', 'push', `${registry.host}/team/ranges:v1`, '--image', 'busybox', '--data-dir', server.dataDir], creds);
    assert.equal(r.code, 0, r.stderr);
    const client = new RegistryClient(ref, { credentials: registry.credentials });
    assert.deepEqual(await client.headBlob(digest), { size: bytes.length });
    assert.equal(await client.headBlob(`sha256:${'0'.repeat(64)}`), undefined);
    for (const [start, end] of [
      [0, 4095],
      [4096, 12287],
      [bytes.length - 100, bytes.length - 1],
    ] as const) {
      const got = await client.getBlob(digest, { start, end });
      assert.equal(got.status, 206);
      const parts: Buffer[] = [];
      for await (const c of got.body) parts.push(c as Buffer);
      assert.deepEqual(Buffer.concat(parts), bytes.subarray(start, end + 1), `bytes ${start}-${end}`);
    }
  });

  test('the registry restarted in the middle of a pull: the download resumes and the pull succeeds', async () => {
    // 24 MiB of random bytes: the registry dies while most of the layer is still to come.
    const big = await buildTestImage(server.dsec.images, 'bigtest:v1', (root) => writeFileSync(`${root}/random`, randomBytes(24 << 20)));
    const ref = `${registry.host}/team/bigtest:v1`;
    const push = await runCli(['image', 'push', ref, '--data-dir', server.dataDir], creds);
    assert.equal(push.code, 0, push.stderr);

    const dataDir = makeDataDir();
    dirsToRemove.push({ dataDir, edgeId: newEdgeId() });
    const layers = new LayerStore(dataDir);
    const images = new ImageStore(dataDir, layers);
    const startsBefore = registry.starts;
    let restarted: Promise<void> | undefined;
    const retries: string[] = [];
    const client = new RegistryClient(parseRegistryRef(ref), { credentials: registry.credentials, onRetry: (why) => retries.push(why) });
    const result = await pullImage(images, client, parseRegistryRef(ref), {
      onBytes: (_layer, received) => {
        if (restarted || received === 0) return;
        // The first bytes arrived: kill the registry, and start it again a moment later.
        restarted = registry.kill().then(() => new Promise((r) => setTimeout(r, 500)).then(() => registry.start()));
      },
    });
    await restarted;
    assert.equal(registry.starts, startsBefore + 1, 'the registry was restarted during the pull');
    assert.ok(result.resumes >= 1, `the download broke off and resumed (resumes ${result.resumes})`);
    assert.ok(
      retries.some((w) => /ECONNREFUSED|ECONNRESET|other side closed|socket/.test(w)),
      `the client retried while the registry was down: ${retries.join(' | ')}`,
    );
    assert.equal(result.id, big.id);
    const layer = images.get(result.id)!.layers[0]!;
    assert.ok(layers.has(layer));
    assert.equal(readFileSync(layers.path(layer)).length, server.dsec.images.layers.size(layer));
  });

  test('wrong or missing credentials: a clear 401 message, exit code 1, nothing pulled', async () => {
    const ref = `${registry.host}/team/regtest:v1`;
    const dataDir = makeDataDir();
    dirsToRemove.push({ dataDir, edgeId: newEdgeId() });
    const wrong = await runCli(['image', 'pull', ref, '--data-dir', dataDir], { ...creds, DSEC_REGISTRY_PASSWORD: 'not-the-password' });
    assert.equal(wrong.code, 1);
    assert.match(wrong.stderr, /rejected the credentials of user "trainer" \(HTTP 401: UNAUTHORIZED: authentication required\)/);
    assert.doesNotMatch(wrong.stderr, /^\s+at /m, 'no stack trace');
    const none = await runCli(['image', 'push', ref, '--image', 'busybox', '--data-dir', server.dataDir], {});
    assert.equal(none.code, 1);
    assert.match(none.stderr, /requires credentials \(HTTP 401.*set DSEC_REGISTRY_USER and DSEC_REGISTRY_PASSWORD/);
    assert.deepEqual(new ImageStore(dataDir, new LayerStore(dataDir)).list(), []);
    const client = new RegistryClient(parseRegistryRef(ref), { credentials: { username: 'trainer', password: 'nope' } });
    await assert.rejects(client.getManifest('v1'), (err: unknown) => err instanceof RegistryAuthError && err.status === 401);
  });

  test('an edge configured with the registry fetches layers from it, and from the control plane what the registry lacks', async () => {
    const controlDir = makeDataDir();
    const edgeDir = makeDataDir();
    const edgeId = newEdgeId();
    const control = await startControlPlane(compileOptions({ dataDir: controlDir, listen: '127.0.0.1:0', logLevel: 'silent' }, {}));
    let daemon: RunningEdgeDaemon | undefined;
    try {
      await buildBusyboxImage(control.images);
      const marker = `edge-${randomBytes(6).toString('hex')}`;
      const pushedImage = await buildTestImage(control.images, 'viaregistry:v1', (root) => writeFileSync(`${root}/marker`, marker));
      const busyboxLayer = control.images.get(control.images.resolve('busybox')!)!.layers[0]!;
      const markerLayer = control.images.get(pushedImage.id)!.layers[0]!;
      const stacked = control.images.put({ layers: [busyboxLayer, markerLayer], config: control.images.get(pushedImage.id)!.config });
      control.images.tag('viaregistry:v1', stacked);
      const repo = parseRegistryRef(`${registry.host}/team/cluster`, { requireName: false });
      await pushImage(control.images, 'viaregistry:v1', new RegistryClient(repo, { credentials: registry.credentials }), 'v1');
      // An image the registry does not have: its layer must come from the control plane.
      const localOnly = await buildTestImage(control.images, 'localonly:v1', (root) => writeFileSync(`${root}/marker`, 'local'));
      const localLayer = control.images.get(localOnly.id)!.layers[0]!;
      // Pushed, but first used while the registry is down.
      const later = await buildTestImage(control.images, 'later:v1', (root) => writeFileSync(`${root}/marker`, 'later'));
      await pushImage(control.images, later.id, new RegistryClient(repo, { credentials: registry.credentials }), 'later');

      daemon = await startEdgeDaemon({
        join: control.url,
        token: control.joinToken,
        listen: '127.0.0.1:0',
        dataDir: edgeDir,
        id: edgeId,
        pool: 'default',
        labels: {},
        cpuOvercommit: 0,
        maxSandboxes: 16,
        layerCacheMiB: 1024,
        registry: { ref: repo, credentials: registry.credentials },
        logLevel: 'silent',
      });
      const conn = { url: control.url, apiKey: control.apiKey };
      const before = registry.requests().length;
      const sb = await Sandbox.create({ ...conn, image: 'viaregistry:v1' });
      assert.equal((await sb.commands.run('cat /marker')).stdout, marker);
      const fetched = registry
        .requests()
        .slice(before)
        .filter((l) => /"GET \/v2\/team\/cluster\/blobs\/sha256:/.test(l) && / 200 /.test(l));
      for (const layer of [busyboxLayer, markerLayer])
        assert.ok(
          fetched.some((l) => l.includes(layer)),
          `the edge fetched ${layer} from the registry:\n${fetched.join('\n')}`,
        );

      const mid = registry.requests().length;
      // busybox:latest and the local-only layer: busybox is cached on the node now; the other is not in the registry.
      const sb2 = await Sandbox.create({ ...conn, image: 'busybox', layers: [localOnly.id] });
      assert.equal((await sb2.commands.run('cat /marker')).stdout, 'local');
      const asked = registry.requests().slice(mid);
      assert.ok(
        asked.some((l) => l.includes(`HEAD /v2/team/cluster/blobs/${localLayer}`) && / 404 /.test(l)),
        `the edge asked the registry first:\n${asked.join('\n')}`,
      );
      assert.ok(!asked.some((l) => l.includes(`GET /v2/team/cluster/blobs/${localLayer}`)));

      // The registry is down: the layer comes from the control plane, and the sandbox starts.
      await registry.kill();
      try {
        const sb3 = await Sandbox.create({ ...conn, image: 'busybox', layers: [later.id] });
        assert.equal((await sb3.commands.run('cat /marker')).stdout, 'later');
        await sb3.kill();
      } finally {
        await registry.start();
      }
      await sb.kill();
      await sb2.kill();
    } finally {
      await daemon?.close({ killAll: true });
      await control.close();
      await assertCleanAndRemove(edgeDir, edgeId);
      await assertCleanAndRemove(controlDir, 'control');
    }
  });

  test("an edge without --registry joins a control plane that has one: it gets the registry at join and reads the image's layers from it, not from the control plane", async () => {
    const controlDir = makeDataDir();
    const edgeDir = makeDataDir();
    const edgeId = newEdgeId();
    const repository = `${registry.host}/team/joined`;
    // The control plane's registry account comes from its environment, as `dsec control` reads it.
    const saved = { user: process.env['DSEC_REGISTRY_USER'], password: process.env['DSEC_REGISTRY_PASSWORD'] };
    process.env['DSEC_REGISTRY_USER'] = registry.credentials!.username;
    process.env['DSEC_REGISTRY_PASSWORD'] = registry.credentials!.password;
    let control: Awaited<ReturnType<typeof startControlPlane>>;
    try {
      control = await startControlPlane(
        compileOptions({ dataDir: controlDir, registry: repository, listen: '127.0.0.1:0', logLevel: 'silent' }, {}),
      );
    } finally {
      for (const [k, v] of [
        ['DSEC_REGISTRY_USER', saved.user],
        ['DSEC_REGISTRY_PASSWORD', saved.password],
      ] as const) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
    let daemon: RunningEdgeDaemon | undefined;
    try {
      await buildBusyboxImage(control.images);
      const marker = `joined-${randomBytes(6).toString('hex')}`;
      const img = await buildTestImage(control.images, 'joinedreg:v1', (root) => writeFileSync(`${root}/marker`, marker));
      const layers = [control.images.get(control.images.resolve('busybox')!)!.layers[0]!, ...control.images.get(img.id)!.layers];
      control.images.tag('joinedreg:v1', control.images.put({ layers, config: control.images.get(img.id)!.config }));
      // The registry is the control plane's blob store: an image's layers are there once it is recorded.
      await control.images.flush();
      const reader = new RegistryClient(parseRegistryRef(repository, { requireName: false }), { credentials: registry.credentials });
      for (const l of layers) assert.ok(await reader.headBlob(l), `${l} is in the registry once the image is recorded`);

      const joinAnswer = (await (
        await fetch(`${control.url}/v1/cluster/edges`, {
          method: 'POST',
          headers: { authorization: `Bearer ${control.joinToken}`, 'content-type': 'application/json' },
          body: JSON.stringify({
            id: 'probe',
            url: 'http://127.0.0.1:9',
            pool: 'probe',
            labels: {},
            cpuOvercommit: 0,
            info: {
              id: 'probe',
              protocol: 1,
              version: 'probe',
              state: 'stopped',
              sandboxes: 0,
              maxSandboxes: 1,
              capacity: {
                cpus: 1,
                memoryBytes: 1,
                memoryAvailableBytes: 1,
                cpuCommitted: 0,
                memoryCommittedMiB: 0,
                pidsCommitted: 0,
                pidMax: 1,
                pidsInUse: 0,
              },
              layerCache: { entries: 0, bytes: 0, chargedBytes: 0, budgetBytes: 0, mounted: 0, evictions: 0, overBudget: false },
              cachedLayers: [],
            },
          }),
        })
      ).json()) as { registry?: { repository: string; username?: string } };
      assert.deepEqual(
        { repository: joinAnswer.registry?.repository, username: joinAnswer.registry?.username },
        { repository, username: registry.credentials!.username },
        'the join answer names the registry and its account',
      );
      await control.control.edges.remove('probe');

      daemon = await startEdgeDaemon({
        join: control.url,
        token: control.joinToken,
        listen: '127.0.0.1:0',
        dataDir: edgeDir,
        id: edgeId,
        pool: 'default',
        labels: {},
        cpuOvercommit: 0,
        maxSandboxes: 16,
        layerCacheMiB: 1024,
        logLevel: 'silent',
      });
      const before = registry.requests().length;
      const sb = await Sandbox.create({ url: control.url, apiKey: control.apiKey, image: 'joinedreg:v1' });
      assert.equal((await sb.commands.run('cat /marker')).stdout, marker);
      const asked = registry.requests().slice(before);
      // The control plane only uploads (HEAD, POST/PUT); only an edge GETs a blob.
      for (const l of layers) {
        assert.ok(
          asked.some((line) => line.includes(`"GET /v2/team/joined/blobs/${l} `) && / 200 /.test(line)),
          `the edge read ${l} from the registry:\n${asked.join('\n')}`,
        );
        assert.ok(await reader.headBlob(l), `${l} is in the registry now`);
      }
      await sb.kill();
    } finally {
      await daemon?.close({ killAll: true });
      await control.close();
      await assertCleanAndRemove(edgeDir, edgeId);
      await assertCleanAndRemove(controlDir, 'control');
    }
  });

  test(
    'a lazy edge configured with the registry reads chunks from it with Range requests',
    { skip: existsSync('/dev/fuse') ? (existsSync(CHUNK_FUSE_BINARY) ? undefined : `${CHUNK_FUSE_BINARY} not built`) : 'no /dev/fuse' },
    async () => {
      const controlDir = makeDataDir();
      const edgeDir = makeDataDir();
      const edgeId = newEdgeId();
      const control = await startControlPlane(
        compileOptions({ dataDir: controlDir, listen: '127.0.0.1:0', logLevel: 'silent', layerChunkKiB: '64' }, {}),
      );
      let daemon: RunningEdgeDaemon | undefined;
      try {
        await buildBusyboxImage(control.images);
        const marker = `lazy-${randomBytes(6).toString('hex')}`;
        const img = await buildTestImage(control.images, 'lazyreg:v1', (root) => writeFileSync(`${root}/marker`, marker));
        const stacked = control.images.put({
          layers: [control.images.get(control.images.resolve('busybox')!)!.layers[0]!, ...control.images.get(img.id)!.layers],
          config: control.images.get(img.id)!.config,
        });
        control.images.tag('lazyreg:v1', stacked);
        const repo = parseRegistryRef(`${registry.host}/team/lazy`, { requireName: false });
        await pushImage(control.images, 'lazyreg:v1', new RegistryClient(repo, { credentials: registry.credentials }), 'v1');
        daemon = await startEdgeDaemon({
          join: control.url,
          token: control.joinToken,
          listen: '127.0.0.1:0',
          dataDir: edgeDir,
          id: edgeId,
          pool: 'default',
          labels: {},
          cpuOvercommit: 0,
          maxSandboxes: 16,
          layerCacheMiB: 1024,
          layerFetch: 'lazy',
          registry: { ref: repo, credentials: registry.credentials },
          logLevel: 'silent',
        });
        const before = registry.requests().length;
        const sb = await Sandbox.create({ url: control.url, apiKey: control.apiKey, image: 'lazyreg:v1' });
        assert.equal((await sb.commands.run('cat /marker')).stdout, marker);
        const stats = await daemon.chunkProxy!.stats();
        assert.ok(stats.registryRanges > 0, `chunks came from the registry: ${JSON.stringify(stats)}`);
        assert.ok(stats.fallback > 0, `chunk indexes came from the control plane: ${JSON.stringify(stats)}`);
        const ranged = registry
          .requests()
          .slice(before)
          .filter((l) => /"GET \/v2\/team\/lazy\/blobs\/sha256:[0-9a-f]+ HTTP\/1\.1" 206 /.test(l));
        assert.ok(ranged.length > 0, `the registry answered range requests (206):\n${registry.requests().slice(before).join('\n')}`);
        await sb.kill();
      } finally {
        await daemon?.close({ killAll: true });
        await control.close();
        await assertCleanAndRemove(edgeDir, edgeId);
        await assertCleanAndRemove(controlDir, 'control');
      }
    },
  );

  test("the API's push and pull (SDK Image.push/pull) with the control plane's registry account, which goes to the cluster's registry; its refusals as 4xx codes", async () => {
    const saved = { user: process.env['DSEC_REGISTRY_USER'], password: process.env['DSEC_REGISTRY_PASSWORD'] };
    process.env['DSEC_REGISTRY_USER'] = registry.credentials!.username;
    process.env['DSEC_REGISTRY_PASSWORD'] = registry.credentials!.password;
    // The account is sent only to the cluster's registry (DSEC_REGISTRY), so this control plane has it as that.
    const controlDir = makeDataDir();
    const control = await startControlPlane(
      compileOptions({ dataDir: controlDir, registry: `${registry.host}/team/apicluster`, listen: '127.0.0.1:0', logLevel: 'silent' }, {}),
    );
    const conn = { url: control.url, apiKey: control.apiKey };
    try {
      await buildBusyboxImage(control.images);
      const ref = `${registry.host}/team/api:v1`;
      const pushed = await Image.push('busybox', ref, conn);
      assert.equal(pushed.ref, ref);
      assert.match(pushed.digest, /^sha256:[0-9a-f]{64}$/);
      const pulled = await Image.pull(`${registry.host}/team/api@${pushed.digest}`, { ...conn, name: 'apipulled:v1' });
      assert.equal(pulled.image.id, control.images.resolve('busybox'));
      assert.equal(pulled.digest, pushed.digest);
      assert.equal(pulled.fetchedLayers, 0, 'every layer was here already');
      assert.ok(pulled.image.names.includes('apipulled:v1'));

      const api = (path: string, body: unknown) =>
        fetch(`${control.url}${path}`, {
          method: 'POST',
          headers: { authorization: `Bearer ${control.apiKey}`, 'content-type': 'application/json' },
          body: JSON.stringify(body),
        });
      const missing = await api('/v1/images/pull', { ref: `${registry.host}/team/api:nope` });
      assert.equal(missing.status, 404);
      assert.equal(((await missing.json()) as { error: { code: string } }).error.code, 'IMAGE_NOT_FOUND');
      const badRef = await api('/v1/images/pull', { ref: 'no-host-here' });
      assert.equal(badRef.status, 400);
      assert.match(((await badRef.json()) as { error: { message: string } }).error.message, /no registry host/);
      const noImage = await api('/v1/images/push', { image: 'nosuchimage', ref });
      assert.equal(noImage.status, 404);

      process.env['DSEC_REGISTRY_PASSWORD'] = 'wrong';
      const refused = await api('/v1/images/pull', { ref });
      assert.equal(refused.status, 403);
      const body = (await refused.json()) as { error: { code: string; message: string; details: { registryStatus: number } } };
      assert.equal(body.error.code, 'REGISTRY_AUTH_FAILED');
      assert.match(body.error.message, /rejected the credentials of user "trainer" \(HTTP 401/);
      assert.equal(body.error.details.registryStatus, 401);
      await assert.rejects(
        Image.push('busybox', ref, conn),
        (err: unknown) => err instanceof AuthError && err.code === 'REGISTRY_AUTH_FAILED',
      );
    } finally {
      for (const [k, v] of [
        ['DSEC_REGISTRY_USER', saved.user],
        ['DSEC_REGISTRY_PASSWORD', saved.password],
      ] as const) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
      await control.close({ killAll: true });
      await assertCleanAndRemove(controlDir, 'control');
    }
  });

  test('a container image (an OCI index per platform, gzip layers) is pulled and imported; a Dockerfile FROM its reference pulls it', async () => {
    const ref = `${registry.host}/team/container:v2`;
    const client = new RegistryClient(parseRegistryRef(ref), { credentials: registry.credentials });
    const put = async (bytes: Buffer): Promise<{ digest: string; size: number }> => {
      await client.putBlobBytes(sha256Digest(bytes), bytes);
      return { digest: sha256Digest(bytes), size: bytes.length };
    };
    const busybox = readFileSync('/bin/busybox');
    const layer1 = ustar([
      { name: 'bin/', type: 'dir', mode: 0o755 },
      { name: 'bin/busybox', data: busybox, mode: 0o755 },
      ...['sh', 'cat', 'echo', 'ls', 'test', 'mkdir', 'printf', 'id'].map((a) => ({
        name: `bin/${a}`,
        type: 'symlink' as const,
        linkname: 'busybox',
      })),
      { name: 'etc/', type: 'dir', mode: 0o755 },
      { name: 'etc/passwd', data: 'root:x:0:0:root:/root:/bin/sh\n' },
      { name: 'etc/group', data: 'root:x:0:\n' },
      { name: 'tmp/', type: 'dir', mode: 0o1777 },
    ]);
    const layer2 = ustar([{ name: 'greeting.txt', data: 'from a container image\n' }]);
    const layers: { mediaType: string; digest: string; size: number }[] = [];
    for (const t of [layer1, layer2])
      layers.push({ mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip', ...(await put(gzipSync(t))) });
    const manifestFor = async (architecture: string): Promise<Buffer> => {
      const config = Buffer.from(
        JSON.stringify({
          architecture,
          os: 'linux',
          config: { Env: ['PATH=/bin', 'FROM_IMAGE=yes'], Cmd: ['/bin/sh'], WorkingDir: '/' },
          rootfs: { type: 'layers', diff_ids: [sha256Digest(layer1), sha256Digest(layer2)] },
        }),
      );
      const m = Buffer.from(
        JSON.stringify({
          schemaVersion: 2,
          mediaType: 'application/vnd.oci.image.manifest.v1+json',
          config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...(await put(config)) },
          layers,
        }),
      );
      await client.putManifest(sha256Digest(m), 'application/vnd.oci.image.manifest.v1+json', m);
      return m;
    };
    const amd64 = await manifestFor('amd64');
    const arm64 = await manifestFor('arm64');
    const index = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: 'application/vnd.oci.image.index.v1+json',
        manifests: [
          {
            mediaType: 'application/vnd.oci.image.manifest.v1+json',
            digest: sha256Digest(arm64),
            size: arm64.length,
            platform: { os: 'linux', architecture: 'arm64' },
          },
          {
            mediaType: 'application/vnd.oci.image.manifest.v1+json',
            digest: sha256Digest(amd64),
            size: amd64.length,
            platform: { os: 'linux', architecture: 'amd64' },
          },
        ],
      }),
    );
    await client.putManifest('v2', 'application/vnd.oci.image.index.v1+json', index);

    const dataDir = makeDataDir();
    const edgeId = newEdgeId();
    dirsToRemove.push({ dataDir, edgeId });
    const pull = await runCli(['image', 'pull', ref, '--data-dir', dataDir, '--json'], creds);
    assert.equal(pull.code, 0, pull.stderr);
    const pulled = JSON.parse(pull.stdout) as { id: string; digest: string; name: string; fetchedLayers: number };
    assert.equal(pulled.digest, sha256Digest(index), 'pulled by the index the tag names');
    assert.equal(pulled.name, 'container:v2');
    assert.equal(pulled.fetchedLayers, 2);
    const store = new ImageStore(dataDir, new LayerStore(dataDir));
    const image = store.get(store.resolve('container:v2')!)!;
    assert.equal(image.layers.length, 2, 'one EROFS layer per container layer');
    assert.ok(image.config.env.includes('FROM_IMAGE=yes'));

    // A Dockerfile FROM the registry reference (no dsec runs on the data dir: the CLI starts one
    // for the build, with this shell's registry credentials): its FROM pulls.
    const ctx = makeDataDir();
    dirsToRemove.push({ dataDir: ctx, edgeId: newEdgeId() });
    writeFileSync(`${ctx}/Dockerfile`, `FROM ${registry.host}/team/container:v2\nRUN echo built >> /greeting.txt\n`);
    // The pulled name is taken away first, so the build must pull (the import cache converts nothing twice).
    store.untag('container:v2');
    const build = await runCli(['image', 'build', '-f', `${ctx}/Dockerfile`, ctx, '--name', 'from-registry', '--data-dir', dataDir], creds);
    assert.equal(build.code, 0, build.stderr);
    assert.match(build.stderr, /pulling .*team\/container:v2/);
    const dsec = await startDsec(dataDir, { edgeId });
    try {
      const sb = await Sandbox.create({ url: dsec.url, apiKey: dsec.apiKey, image: 'from-registry' });
      const r = await sb.commands.run('cat /greeting.txt; echo "$FROM_IMAGE"');
      assert.equal(r.exitCode, 0, r.stderr);
      assert.equal(r.stdout, 'from a container image\nbuilt\nyes\n');
      await sb.kill();
    } finally {
      await dsec.close({ killAll: true });
    }
  });

  test('a container image whose config does not match its layers is refused with why, and nothing is recorded', async () => {
    const client = new RegistryClient(parseRegistryRef(`${registry.host}/team/container:v1`), { credentials: registry.credentials });
    const config = Buffer.from('{}');
    await client.putBlobBytes(sha256Digest(config), config);
    const layer = Buffer.from('not a layer');
    await client.putBlobBytes(sha256Digest(layer), layer);
    const body = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: 'application/vnd.oci.image.manifest.v1+json',
        config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: sha256Digest(config), size: config.length },
        layers: [{ mediaType: 'application/vnd.oci.image.layer.v1.tar', digest: sha256Digest(layer), size: layer.length }],
      }),
    );
    await client.putManifest('v1', 'application/vnd.oci.image.manifest.v1+json', body);
    const dataDir = makeDataDir();
    dirsToRemove.push({ dataDir, edgeId: newEdgeId() });
    const r = await runCli(['image', 'pull', `${registry.host}/team/container:v1`, '--data-dir', dataDir], creds);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /(^|\n)dsec: .*team\/container: the image config lists 0 diff_ids but the manifest has 1 layers\n$/);
    assert.deepEqual(
      new ImageStore(dataDir, new LayerStore(dataDir)).list().filter((i) => i.names.includes('container:v1')),
      [],
    );
  });
});

describe('OCI registry with Bearer-token auth', { skip: integrationSkipReason() ?? registrySkipReason(), timeout: 120_000 }, () => {
  let registry: TestRegistry & { tokens?: TokenService };
  const dirs: string[] = [];

  before(async () => {
    registry = await startTestRegistry({ auth: 'token' });
  });
  after(async () => {
    for (const d of dirs) await assertCleanAndRemove(d, 'none');
    await registry?.close();
  });

  test("the client answers the registry's Bearer challenge with a token from its token service: push, then pull into another store", async () => {
    const from = makeDataDir();
    const to = makeDataDir();
    dirs.push(from, to);
    const src = new ImageStore(from, new LayerStore(from));
    const built = await buildTestImage(src, 'tokentest:v1', (root) => writeFileSync(`${root}/marker`, 'token'));
    const ref = parseRegistryRef(`${registry.host}/team/tokentest:v1`);
    // The token service listens on another port than the registry: trusted by name (DSEC_REGISTRY_TOKEN_HOSTS).
    const tokenHosts = [new URL(registry.tokens!.realm).host];
    const pushed = await pushImage(src, 'tokentest:v1', new RegistryClient(ref, { credentials: registry.credentials, tokenHosts }), 'v1');
    // The registry lists a scope's actions in no fixed order (pull,push or push,pull).
    assert.ok(
      registry.tokens!.scopes.some((x) => /^repository:team\/tokentest:(pull,push|push,pull)$/.test(x)),
      `a push token was asked for: ${registry.tokens!.scopes.join(' ')}`,
    );
    const dst = new ImageStore(to, new LayerStore(to));
    const pulled = await pullImage(dst, new RegistryClient(ref, { credentials: registry.credentials, tokenHosts }), ref);
    assert.equal(pulled.id, built.id);
    assert.equal(pulled.digest, pushed.digest);
    assert.ok(
      registry.tokens!.scopes.includes('repository:team/tokentest:pull'),
      `a pull token was asked for: ${registry.tokens!.scopes.join(' ')}`,
    );
  });

  test('wrong credentials: the token service refuses them, and the error says so', async () => {
    const ref = parseRegistryRef(`${registry.host}/team/tokentest:v1`);
    const client = new RegistryClient(ref, {
      credentials: { username: 'trainer', password: 'wrong' },
      tokenHosts: [new URL(registry.tokens!.realm).host],
    });
    await assert.rejects(client.getManifest('v1'), (err: unknown) => {
      assert.ok(err instanceof RegistryAuthError);
      assert.equal(err.status, 401);
      assert.match(err.message, /the token service http:\/\/127\.0\.0\.1:\d+ rejected the credentials of user "trainer" \(HTTP 401/);
      return true;
    });
  });

  test('a token service on another host than the registry, not trusted by name, is not sent the credentials', async () => {
    const ref = parseRegistryRef(`${registry.host}/team/tokentest:v1`);
    const client = new RegistryClient(ref, { credentials: registry.credentials, tokenHosts: [] });
    const asked = registry.tokens!.scopes.length;
    await assert.rejects(client.getManifest('v1'), (err: unknown) => {
      assert.ok(err instanceof RegistryAuthError);
      assert.match(
        err.message,
        /not on the registry's host, so it was not sent the credentials of user "trainer".*DSEC_REGISTRY_TOKEN_HOSTS/,
      );
      return true;
    });
    assert.equal(registry.tokens!.scopes.length, asked, 'the token service granted nothing: it got no credentials');
  });
});
