/**
 * The Dockerfile parser on dockerfile-ast: heredocs (`RUN <<EOF`, `cat <<EOF > f`, `<<-`, quoted
 * delimiters, several in one RUN), the escape directive, CRLF, comments inside continuations,
 * and what is refused with a line number (an unclosed heredoc, a bad escape directive, ADD <<EOF). Real builds
 * on busybox run heredoc RUNs in sandboxes and make files of COPY heredocs.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { buildDockerfile } from '../../src/image/dockerfile/builder.js';
import { DockerfileError, parseDockerfile } from '../../src/image/dockerfile/parser.js';
import { controlPlaneSandboxes } from '../../src/control/build-sandboxes.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';

const HEREDOCS = `FROM busybox
ENV WHO=dsec
RUN <<EOF
echo one > /one
# a comment line belongs to the script
echo "two \${WHO}" >> /one
EOF
RUN cat <<'EOT' > /two && \\
    echo after >> /two
\${NOT_EXPANDED}
EOT
RUN <<-A cat > /three; cat >> /three <<"B"
\t\ttabs stripped
\tA
b $WHO
B
RUN echo done > /four
`;

describe('Dockerfile parser (dockerfile-ast)', () => {
  test('heredocs: bodies, delimiters, <<- and quoted names; the instruction after them', () => {
    const ins = parseDockerfile(HEREDOCS);
    assert.deepEqual(
      ins.map((i) => [i.keyword, i.line, i.heredocs.map((h) => [h.name, h.content, h.stripTabs])]),
      [
        ['FROM', 1, []],
        ['ENV', 2, []],
        ['RUN', 3, [['EOF', 'echo one > /one\n# a comment line belongs to the script\necho "two ${WHO}" >> /one\n', false]]],
        ['RUN', 8, [['EOT', '${NOT_EXPANDED}\n', false]]],
        [
          'RUN',
          12,
          [
            ['A', 'tabs stripped\n', true],
            ['B', 'b $WHO\n', false],
          ],
        ],
        ['RUN', 17, []],
      ],
    );
    assert.equal(ins[3]!.args, "cat <<'EOT' > /two &&     echo after >> /two");
    assert.equal(ins[3]!.script, "cat <<'EOT' > /two &&     echo after >> /two\n${NOT_EXPANDED}\nEOT\n");
  });

  test('continuations drop comment and empty lines; CRLF; the escape directive; JSON form across lines', () => {
    const ins = parseDockerfile('# escape=`\r\nFROM busybox\r\nRUN echo a `\r\n  # dropped\r\n\r\n  b\r\nCMD ["echo", `\r\n  "x"]\r\n');
    assert.deepEqual(
      ins.map((i) => [i.keyword, i.args, i.line, i.escape]),
      [
        ['FROM', 'busybox', 2, '`'],
        ['RUN', 'echo a   b', 3, '`'],
        ['CMD', '["echo",   "x"]', 7, '`'],
      ],
    );
  });

  test('refused with the line: an unclosed heredoc, a bad escape directive, an unknown instruction', () => {
    const refused = (text: string, re: RegExp): void =>
      assert.throws(
        () => parseDockerfile(text),
        (e: Error) => e instanceof DockerfileError && re.test(e.message),
      );
    refused('FROM busybox\nRUN <<EOF\necho never closed\n', /line 2: heredoc <<EOF is never closed/);
    // dockerfile-ast reads a body line ending in the escape character as continued into the
    // delimiter line (Docker does not): refused rather than built as something else.
    refused('FROM busybox\nRUN <<EOF\necho a \\\nEOF\n', /line 2: heredoc <<EOF is never closed/);
    refused('# escape=x\nFROM busybox\n', /line 1: invalid escape directive "x"/);
    refused('FROM busybox\nFROBNICATE x\n', /line 2: unknown instruction FROBNICATE/);
    refused('FROM busybox\nADD <<EOF /f\nx\nEOF\n', /line 2: ADD <<EOF \(a heredoc\) is not supported: use COPY <<EOF/);
  });
});

describe('Dockerfile heredoc builds (busybox)', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;
  let ctx: string;
  before(async () => {
    server = await startTestServer();
    ctx = mkdtempSync('/var/tmp/dsec-heredoc-ctx-');
  });
  after(async () => {
    if (ctx) rmSync(ctx, { recursive: true, force: true });
    await server?.close();
  });
  const build = (dockerfile: string, name: string): ReturnType<typeof buildDockerfile> =>
    buildDockerfile({
      images: server.dsec.images,
      sandboxes: controlPlaneSandboxes(server.dsec.control),
      dockerfile,
      contextDir: ctx,
      name,
    });

  test('RUN heredocs run in the sandbox as Docker runs them', async () => {
    const r = await build(HEREDOCS, 'df-heredoc');
    assert.equal(r.executed, 4);
    const sb = await Sandbox.create({ ...server.conn, image: 'df-heredoc' });
    try {
      const cat = async (f: string): Promise<string> => {
        const out = await sb.commands.run(`cat ${f}`);
        assert.equal(out.exitCode, 0, out.stderr);
        return out.stdout;
      };
      assert.equal(await cat('/one'), 'one\ntwo dsec\n');
      assert.equal(await cat('/two'), '${NOT_EXPANDED}\nafter\n');
      assert.equal(await cat('/three'), 'tabs stripped\nb $WHO\n');
      assert.equal(await cat('/four'), 'done\n');
    } finally {
      await sb.kill();
    }
  });

  test('COPY heredocs become files: variables substituted unless the delimiter is quoted, --chmod, several into a directory', async () => {
    const dockerfile = [
      'FROM busybox',
      'ARG WHO=dsec',
      'COPY <<EOF /etc/greeting',
      'hello ${WHO} "quoted" \\$HOME',
      'EOF',
      "COPY --chmod=755 <<'RAW' /bin/hi",
      '#!/bin/sh',
      'echo "hi $1 ${WHO}"',
      'RAW',
      'COPY <<A <<B /multi/',
      'a',
      'A',
      'b',
      'B',
      '',
    ].join('\n');
    const r = await build(dockerfile, 'df-copy-heredoc');
    assert.equal(r.executed, 3);
    const sb = await Sandbox.create({ ...server.conn, image: 'df-copy-heredoc' });
    try {
      const run = async (cmd: string): Promise<string> => {
        const out = await sb.commands.run(cmd);
        assert.equal(out.exitCode, 0, out.stderr);
        return out.stdout;
      };
      assert.equal(await run('cat /etc/greeting'), 'hello dsec "quoted" $HOME\n');
      assert.equal(await run('stat -c %a /bin/hi; /bin/hi there'), '755\nhi there \n');
      assert.equal(await run('cat /multi/A /multi/B'), 'a\nb\n');
    } finally {
      await sb.kill();
    }
  });

  test('a #! heredoc script is refused with what to do instead', async () => {
    await assert.rejects(build('FROM busybox\nRUN <<EOF\n#!/bin/python3\nprint(1)\nEOF\n', 'df-shebang'), /RUN python3 <<EOF/);
  });
});
