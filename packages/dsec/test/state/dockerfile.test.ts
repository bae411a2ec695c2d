/**
 * Dockerfile builds on busybox (no debootstrap needed) against a real server: RUN in real
 * sandboxes, COPY of a directory, ENV/WORKDIR/USER/LABEL/CMD in the config, one layer per
 * RUN/COPY, the build cache, build args, and the CLI through the server's API.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { buildDockerfile, type DockerfileBuildOptions } from '../../src/image/dockerfile/builder.js';
import { DockerfileError, parseDockerfile, splitWords } from '../../src/image/dockerfile/parser.js';
import { controlPlaneSandboxes } from '../../src/control/build-sandboxes.js';
import { sdkSandboxes } from '../../src/image/dockerfile/sandboxes.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { SYSTEM } from '../../src/control/service/callers.js';

const DOCKERFILE = `# syntax is ignored
FROM busybox
ARG WHO=world
ENV GREETING=hello \\
    MODE="two words"
RUN echo "$GREETING $WHO" > /greeting.txt
COPY app /app
WORKDIR /app
# runs as nobody from here on
USER 65534
RUN id -u > /tmp/uid.txt && cat data.txt > /tmp/seen.txt
LABEL purpose=test "with space"=yes
CMD ["cat", "/greeting.txt"]
`;

describe('Dockerfile parser', () => {
  test('continuations, comments, directives and instruction lines', () => {
    const ins = parseDockerfile('# escape=`\nFROM busybox\nRUN echo a `\n  # comment inside\n  b\nenv A=1\n');
    assert.deepEqual(
      ins.map((i) => [i.keyword, i.args, i.line]),
      [
        ['FROM', 'busybox', 2],
        ['RUN', 'echo a   b', 3],
        ['ENV', 'A=1', 6],
      ],
    );
    assert.throws(() => parseDockerfile('FROBNICATE x'), DockerfileError);
  });

  test('word splitting and substitution follow Docker', () => {
    const vars = new Map([
      ['A', 'x'],
      ['E', ''],
    ]);
    assert.deepEqual(splitWords(`$A "\${A}y" '$A' \${B:-dflt} \${A:+set} \${E:-empty} a\\ b`, vars), [
      'x',
      'xy',
      '$A',
      'dflt',
      'set',
      'empty',
      'a b',
    ]);
  });
});

describe('Dockerfile builds (busybox)', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;
  let ctx: string;
  let lines: string[];
  let base: Omit<DockerfileBuildOptions, 'progress'>;

  before(async () => {
    server = await startTestServer();
    ctx = mkdtempSync('/var/tmp/dsec-dockerfile-ctx-');
    mkdirSync(join(ctx, 'app', 'lib'), { recursive: true });
    writeFileSync(join(ctx, 'app', 'data.txt'), 'payload\n');
    writeFileSync(join(ctx, 'app', 'run.sh'), '#!/bin/sh\necho running\n', { mode: 0o755 });
    writeFileSync(join(ctx, 'app', 'lib', 'mod.txt'), 'module\n');
    symlinkSync('data.txt', join(ctx, 'app', 'link'));
    writeFileSync(join(ctx, 'app', 'secret.key'), 'not copied\n');
    writeFileSync(join(ctx, '.dockerignore'), '# keys stay out\napp/*.key\n');
    writeFileSync(join(ctx, 'Dockerfile'), DOCKERFILE);
    base = {
      images: server.dsec.images,
      sandboxes: controlPlaneSandboxes(server.dsec.control),
      dockerfile: DOCKERFILE,
      contextDir: ctx,
      name: 'df-test',
    };
  });
  after(async () => {
    if (ctx) rmSync(ctx, { recursive: true, force: true });
    await server?.close();
  });

  const build = (extra: Partial<DockerfileBuildOptions> = {}): ReturnType<typeof buildDockerfile> => {
    lines = [];
    return buildDockerfile({ ...base, progress: (l) => lines.push(l), ...extra });
  };

  test('builds: config from ENV/WORKDIR/USER/LABEL/CMD, one layer per RUN and COPY', async () => {
    const r = await build();
    const busybox = server.dsec.images.get(server.dsec.images.resolve('busybox')!)!;
    const m = server.dsec.images.get(r.id)!;
    assert.equal(m.layers.length, busybox.layers.length + 3, lines.join('\n'));
    assert.deepEqual(m.layers.slice(0, busybox.layers.length), busybox.layers);
    assert.equal(r.executed, 3);
    assert.equal(r.cached, 0);
    assert.equal(r.layersAdded, 3);
    assert.equal(m.config.cwd, '/app');
    assert.equal(m.config.user, '65534');
    assert.deepEqual(m.config.cmd, ['cat', '/greeting.txt']);
    assert.ok(m.config.env.includes('GREETING=hello'));
    assert.ok(m.config.env.includes('MODE=two words'));
    assert.ok(!m.config.env.some((e) => e.startsWith('WHO=')), 'build args are not in the image env');
    assert.equal(m.config.labels['purpose'], 'test');
    assert.equal(m.config.labels['with space'], 'yes');
    assert.ok(lines.includes('Step 5/10 : COPY app /app'), lines.join('\n'));
    assert.deepEqual(server.dsec.images.info(r.id)!.names, ['df-test:latest']);
  });

  test('a sandbox of the image has the files, runs as the USER in the WORKDIR', async () => {
    const sb = await Sandbox.create({ ...server.conn, image: 'df-test' });
    try {
      const run = async (cmd: string): Promise<string> => {
        const r = await sb.commands.run(cmd);
        assert.equal(r.exitCode, 0, r.stderr);
        return r.stdout.trim();
      };
      assert.equal(await run('cat /greeting.txt'), 'hello world');
      assert.equal(await run('pwd; id -u'), '/app\n65534');
      assert.equal(await run('cat /tmp/uid.txt /tmp/seen.txt'), '65534\npayload');
      assert.equal(await run('ls -A /app | sort | tr "\\n" " "'), 'data.txt lib link run.sh');
      assert.equal(await run('stat -c "%u:%g %a" /app/data.txt /app/run.sh'), '0:0 644\n0:0 755');
      assert.equal(await run('readlink /app/link; cat /app/lib/mod.txt'), 'data.txt\nmodule');
      const cmd = server.dsec.images.get(server.dsec.images.resolve('df-test')!)!.config.cmd;
      assert.equal((await sb.commands.run(cmd)).stdout, 'hello world\n');
    } finally {
      await sb.kill();
    }
  });

  test('a rebuild with no change reuses every step (CACHED) and gives the same image', async () => {
    const first = server.dsec.images.resolve('df-test');
    const r = await build();
    assert.equal(r.id, first);
    assert.equal(r.cached, 3);
    assert.equal(r.executed, 0);
    assert.equal(lines.filter((l) => l.startsWith(' ---> CACHED')).length, 3, lines.join('\n'));
  });

  test('a changed file re-runs its COPY and what follows; a build arg re-runs the RUN that sees it', async () => {
    writeFileSync(join(ctx, 'app', 'data.txt'), 'payload 2\n');
    let r = await build();
    assert.deepEqual([r.cached, r.executed], [1, 2], lines.join('\n'));
    r = await build({ buildArgs: { WHO: 'dsec' } });
    assert.deepEqual([r.cached, r.executed], [0, 3], lines.join('\n'));
    const sb = await Sandbox.create({ ...server.conn, image: r.id });
    try {
      assert.equal((await sb.commands.run('cat /greeting.txt /tmp/seen.txt')).stdout, 'hello dsec\npayload 2\n');
    } finally {
      await sb.kill();
    }
  });

  test('a failing RUN fails the build with its exit code and leaves no build sandbox', async () => {
    await assert.rejects(
      build({ dockerfile: 'FROM busybox\nRUN echo about to fail && exit 3\n', name: 'df-fail' }),
      (err: Error) => err instanceof DockerfileError && /non-zero code: 3/.test(err.message),
    );
    assert.ok(lines.includes('  about to fail'), lines.join('\n'));
    assert.deepEqual(
      (await server.dsec.control.sandboxes.list(SYSTEM, {})).filter((s) => s.labels['dsec.build']),
      [],
    );
    assert.equal(server.dsec.images.resolve('df-fail'), undefined);
  });

  test('WORKDIR as the last file-changing instruction is created; USER by name resolves', async () => {
    const r = await build({ dockerfile: 'FROM busybox\nWORKDIR /srv/new\nUSER nobody\nCMD ["pwd"]\n', name: 'df-workdir' });
    assert.equal(r.config.user, '65534:65534');
    const sb = await Sandbox.create({ ...server.conn, image: 'df-workdir' });
    try {
      assert.equal((await sb.commands.run('pwd')).stdout, '/srv/new\n');
    } finally {
      await sb.kill();
    }
  });

  test('multi-stage: a build stage makes files, the final stage copies them (COPY --from), through the server (SDK) too', async () => {
    const dockerfile = [
      'FROM busybox AS build',
      'RUN mkdir -p /out/bin && printf tool > /out/bin/tool && chmod 750 /out/bin/tool && ln -s bin/tool /out/link && ln /out/bin/tool /out/hard',
      'RUN chown -R 65534:65534 /out',
      'FROM busybox',
      'COPY --from=build /out /opt/app/',
      'COPY --from=0 --chown=65534:65534 /out/bin/tool /usr/local/bin/renamed',
      'FROM build AS again',
      'RUN test -x /out/bin/tool',
      'FROM 1',
    ].join('\n');
    // `FROM 1` names no stage (FROM takes names, not indexes) and no image: refused with its line.
    await assert.rejects(
      build({ dockerfile, name: 'df-multi' }),
      (err: Error) => err instanceof DockerfileError && /FROM 1|"1"/.test(err.message),
    );
    const good = dockerfile.split('\n').slice(0, 6).join('\n');
    const viaApi = sdkSandboxes(server.conn, { 'dsec.build': 'dockerfile' });
    for (const sandboxes of [base.sandboxes, viaApi]) {
      const r = await build({ dockerfile: good, name: 'df-multi', sandboxes, noCache: true });
      const busybox = server.dsec.images.get(server.dsec.images.resolve('busybox')!)!;
      assert.equal(server.dsec.images.get(r.id)!.layers.length, busybox.layers.length + 2, 'the final stage: busybox + two COPY layers');
      const sb = await Sandbox.create({ ...server.conn, image: 'df-multi' });
      try {
        const run = async (cmd: string): Promise<string> => {
          const x = await sb.commands.run(cmd);
          assert.equal(x.exitCode, 0, x.stderr);
          return x.stdout.trim();
        };
        assert.equal(await run('cat /opt/app/bin/tool; echo; readlink /opt/app/link; cat /opt/app/hard'), 'tool\nbin/tool\ntool');
        assert.equal(await run('stat -c "%u:%g %a" /opt/app/bin/tool /usr/local/bin/renamed'), '0:0 750\n65534:65534 750');
        assert.equal(await run('test -e /out && echo leaked || echo clean'), 'clean', "the build stage's files are not in the image");
      } finally {
        await sb.kill();
      }
    }
  });

  test('dsec image build -f through the running server (SDK), --no-cache', async () => {
    // Asynchronously: the server answering the CLI runs in this very process.
    const cli = join(import.meta.dirname, '..', '..', 'src', 'cli', 'main.js');
    const args = [
      cli,
      'image',
      'build',
      '-f',
      join(ctx, 'Dockerfile'),
      ctx,
      '--name',
      'df-cli',
      '--no-cache',
      '--build-arg',
      'WHO=cli',
      '--data-dir',
      server.dataDir,
    ];
    const r = await promisify(execFile)(process.execPath, args, { encoding: 'utf8', timeout: 240_000 });
    assert.match(r.stderr, /using the dsec server at http:\/\/127\.0\.0\.1/);
    assert.match(r.stderr, /Step 10\/10 : CMD/);
    assert.match(r.stdout, /^df-cli sha256:[0-9a-f]{64}\n$/);
    const m = server.dsec.images.get(server.dsec.images.resolve('df-cli')!)!;
    assert.equal(m.config.user, '65534');
  });
});
