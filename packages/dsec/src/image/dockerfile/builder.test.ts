import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { Readable } from 'node:stream';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { ExecRequest } from '@dsec/sdk/schema';
import { readTar } from '../oci/tar-reader.js';
import { tarArchive } from '../oci/tar-writer.js';
import { ImageStore, defaultImageConfig, type ImageId } from '../image-store.js';
import { LayerStore } from '../layer-store.js';
import { buildDockerfile } from './builder.js';
import { DockerfileError } from './parser.js';
import type { BuildSandboxes } from './sandboxes.js';

/**
 * A Dockerfile build against a fake platform: image/ needs nothing of control/ to run one (the
 * BuildSandboxes interface is all it asks for), so its steps, cache and config are checked here
 * without root, crun or a server. test/state/dockerfile*.test.ts run real builds.
 */
describe('buildDockerfile through BuildSandboxes', () => {
  let root: string;
  let context: string;
  let images: ImageStore;
  let calls: string[];
  let runs: ExecRequest[];
  let passwd: string | undefined;
  /** What each upload carried: its dir and its entries as `name type uid:gid mode`. */
  let uploads: { dir: string; entries: string[] }[];

  /** Each snapshot adds a layer with new bytes, on top of the sandbox's image. */
  const fake = (): BuildSandboxes => {
    const imageOf = new Map<string, ImageId>();
    let n = 0;
    return {
      async create(image) {
        const id = `sb${++n}`;
        imageOf.set(id, image as ImageId);
        calls.push(`create ${id} user=${images.get(image as ImageId)!.config.user}`);
        return id;
      },
      async run(id, req, onOutput) {
        calls.push(`run ${id}`);
        runs.push(req);
        onOutput(Buffer.from('hello\n'));
        return { exitCode: req.cmd.includes('exit 3') ? 3 : 0, timedOut: false };
      },
      async uploadTar(id, dir, tar) {
        calls.push(`upload ${id} ${dir}`);
        const entries: string[] = [];
        for await (const e of readTar(Readable.from([tar]))) {
          for await (const _ of e.body);
          entries.push(`${e.header.name} ${e.header.type} ${e.header.uid}:${e.header.gid} ${e.header.mode.toString(8)}`);
        }
        uploads.push({ dir, entries });
      },
      async downloadTar(id, path) {
        calls.push(`download ${id} ${path}`);
        // A stage that built /out (a directory with a file and a link) and /out/bin/tool.
        const at = (name: string, type: 'file' | 'dir' | 'symlink', extra: { data?: string; linkname?: string } = {}) => ({
          name,
          type,
          mode: type === 'dir' ? 0o755 : 0o700,
          uid: 1000,
          gid: 1000,
          mtime: 0,
          ...(extra.data !== undefined ? { data: Buffer.from(extra.data) } : {}),
          ...(extra.linkname !== undefined ? { linkname: extra.linkname } : {}),
        });
        const tar =
          path === '/out'
            ? tarArchive([
                at('out', 'dir'),
                at('out/bin', 'dir'),
                at('out/bin/tool', 'file', { data: 'tool' }),
                at('out/link', 'symlink', { linkname: 'bin/tool' }),
              ])
            : tarArchive([at(path.split('/').pop()!, 'file', { data: 'x' })]);
        return (async function* () {
          yield tar;
        })();
      },
      async mkdir(id, path) {
        calls.push(`mkdir ${id} ${path}`);
      },
      async stat(_id, path) {
        return path === '/out' ? 'dir' : path === '/out/bin/tool' ? 'file' : undefined;
      },
      async readFile(id, path) {
        calls.push(`read ${id} ${path}`);
        return path === '/etc/passwd' && passwd !== undefined ? Buffer.from(passwd) : undefined;
      },
      async snapshot(id) {
        calls.push(`snapshot ${id}`);
        const file = images.layers.tempPath();
        writeFileSync(file, `layer ${id} ${Date.now()} ${Math.random()}`);
        const layers = [...images.get(imageOf.get(id)!)!.layers, await images.layers.add(file)];
        return { imageId: images.put({ layers, config: defaultImageConfig() }), layers, layerAdded: true };
      },
      async kill(id) {
        calls.push(`kill ${id}`);
      },
    };
  };

  before(async () => {
    root = mkdtempSync(join(tmpdir(), 'dsec-unit-dockerfile-'));
    context = join(root, 'context');
    mkdirSync(context);
    writeFileSync(join(context, 'app.txt'), 'app');
    images = new ImageStore(root, new LayerStore(root));
    const file = images.layers.tempPath();
    writeFileSync(file, 'base layer');
    images.tag('base', images.put({ layers: [await images.layers.add(file)], config: defaultImageConfig() }));
  });
  after(() => rmSync(root, { recursive: true, force: true }));

  const build = (dockerfile: string, extra: { noCache?: boolean; buildArgs?: Record<string, string> } = {}) => {
    calls = [];
    runs = [];
    uploads = [];
    return buildDockerfile({ images, sandboxes: fake(), dockerfile, contextDir: context, name: 'out:v1', ...extra });
  };

  const DOCKERFILE = [
    'ARG BASE=base',
    'FROM ${BASE}',
    'ARG GREETING',
    'ENV A=1',
    'RUN echo $GREETING',
    'COPY app.txt /srv/',
    'WORKDIR /srv/work',
    'USER 1000:1000',
    'ENTRYPOINT ["/bin/app"]',
    'EXPOSE 80',
  ].join('\n');

  test('each file-changing step runs in a sandbox of the image so far and is killed; config instructions change only the config', async () => {
    const r = await build(DOCKERFILE, { buildArgs: { GREETING: 'hi' } });
    assert.deepEqual(calls, [
      'create sb1 user=0:0',
      'run sb1',
      'snapshot sb1',
      'kill sb1',
      'create sb2 user=0:0',
      'upload sb2 /srv',
      'snapshot sb2',
      'kill sb2',
      // The last WORKDIR is created as root, though USER is 1000 by then.
      'create sb3 user=0:0',
      'mkdir sb3 /srv/work',
      'snapshot sb3',
      'kill sb3',
    ]);
    assert.deepEqual(runs[0]!.cmd, ['/bin/sh', '-c', 'echo $GREETING']);
    assert.deepEqual(runs[0]!.env, { GREETING: 'hi' });
    assert.equal(runs[0]!.cwd, '/');
    assert.deepEqual([r.steps, r.cached, r.executed, r.layersAdded], [10, 0, 3, 3]);
    assert.ok(r.config.env.includes('A=1'));
    assert.equal(r.config.cwd, '/srv/work');
    assert.equal(r.config.user, '1000:1000');
    assert.deepEqual(r.config.entrypoint, ['/bin/app']);
    assert.deepEqual(r.config.cmd, [], 'a new ENTRYPOINT drops the base image CMD');
    assert.equal(r.warnings.length, 1, 'EXPOSE is noted as ignored');
    assert.equal(images.resolve('out:v1'), r.id);
    assert.equal(images.get(r.id)!.layers.length, 4);
  });

  test('the same build again is found in the cache: no sandbox; --no-cache runs every step', async () => {
    const again = await build(DOCKERFILE, { buildArgs: { GREETING: 'hi' } });
    assert.deepEqual(calls, []);
    assert.deepEqual([again.cached, again.executed], [3, 0]);
    const changedArg = await build(DOCKERFILE, { buildArgs: { GREETING: 'ho' } });
    assert.equal(changedArg.executed, 3, 'a build argument RUN sees is part of its cache key');
    const fresh = await build(DOCKERFILE, { buildArgs: { GREETING: 'hi' }, noCache: true });
    assert.deepEqual([fresh.cached, fresh.executed], [0, 3]);
  });

  test('USER by name reads /etc/passwd from a root sandbox of the image; a failing RUN fails the build', async () => {
    passwd = 'root:x:0:0::/root:/bin/sh\napp:x:1234:1235::/home/app:/bin/sh\n';
    const r = await build('FROM base\nUSER app\nCMD ["x"]');
    assert.equal(r.config.user, '1234:1235');
    assert.deepEqual(calls, ['create sb1 user=0:0', 'read sb1 /etc/passwd', 'read sb1 /etc/group', 'kill sb1']);
    await assert.rejects(build('FROM base\nUSER nobody'), DockerfileError);
    await assert.rejects(build('FROM base\nRUN exit 3'), /returned a non-zero code: 3/);
    assert.equal(calls.at(-1), 'kill sb1', 'the failed step sandbox is killed');
    await assert.rejects(build('RUN true'), /RUN before FROM/);
    await assert.rejects(build('FROM base\nFROBNICATE x'), /FROBNICATE is not supported|unknown/i);
  });

  test('multi-stage: COPY --from reads an earlier stage in a sandbox of it, places files as Docker does, owned by root or --chown', async () => {
    const r = await build(
      [
        'FROM base AS build',
        'RUN make',
        'FROM base',
        'COPY --from=build /out /app/',
        'COPY --from=0 --chown=7:8 --chmod=755 /out/bin/tool /usr/local/bin/renamed',
      ].join('\n'),
    );
    // Stage 0's RUN; then each COPY runs in a sandbox of the final stage, reading a root sandbox of stage 0.
    assert.deepEqual(
      calls.filter((c) => !c.startsWith('snapshot')),
      [
        'create sb1 user=0:0',
        'run sb1',
        'kill sb1',
        'create sb2 user=0:0',
        'create sb3 user=0:0',
        'download sb3 /out',
        'kill sb3',
        'mkdir sb2 /app',
        'upload sb2 /app',
        'kill sb2',
        'create sb4 user=0:0',
        'create sb5 user=0:0',
        'download sb5 /out/bin/tool',
        'kill sb5',
        'mkdir sb4 /usr/local/bin',
        'upload sb4 /usr/local/bin',
        'kill sb4',
      ],
    );
    // A directory's contents go into DEST (not DEST/out); owners become root; modes are kept.
    assert.deepEqual(uploads[0], { dir: '/app', entries: ['bin/ dir 0:0 755', 'bin/tool file 0:0 700', 'link symlink 0:0 700'] });
    // A file to a DEST without a trailing slash takes DEST's name; --chown and --chmod apply.
    assert.deepEqual(uploads[1], { dir: '/usr/local/bin', entries: ['renamed file 7:8 755'] });
    assert.equal(r.executed, 3);
    assert.equal(images.get(r.id)!.layers.length, 3, 'the final image is the last stage: base + two COPY layers, not the build stage RUN');
    // Rebuilt unchanged: every step (both stages) from the cache.
    const again = await build(
      [
        'FROM base AS build',
        'RUN make',
        'FROM base',
        'COPY --from=build /out /app/',
        'COPY --from=0 --chown=7:8 --chmod=755 /out/bin/tool /usr/local/bin/renamed',
      ].join('\n'),
    );
    assert.deepEqual([again.cached, again.executed], [3, 0]);
  });

  test('multi-stage: FROM an earlier stage; bad stage references are refused with the line', async () => {
    const r = await build('FROM base AS one\nENV X=1\nFROM one\nENV Y=2');
    assert.ok(r.config.env.includes('X=1') && r.config.env.includes('Y=2'), 'FROM a stage starts from its config');
    await assert.rejects(build('FROM base AS a\nFROM base AS a'), /already defined/);
    await assert.rejects(build('FROM base AS a\nCOPY --from=a /x /y'), /the stage being built/);
    await assert.rejects(build('FROM base\nCOPY --from=nosuch /x /y'), /no earlier stage or dsec image/);
    await assert.rejects(build('FROM base AS a\nFROM base\nCOPY --from=a /nothing /y'), /does not exist in the source stage/);
    await assert.rejects(build('FROM base AS a\nFROM base\nCOPY --from=a /out/* /y/'), /wildcards/);
    await assert.rejects(build('FROM base AS a\nFROM base\nADD --from=a /out /y'), /use COPY --from/);
  });
});
