/**
 * Red team, secrets: from inside a sandbox, look for the control plane's files (client.json with
 * the API key, state.db, the sandbox's crun.log, the data dir), the API key anywhere readable,
 * and the host's environment (/proc/1/environ; the server process runs in this test process, so a
 * canary variable put in this process's environment before the server starts must never show up
 * in a sandbox). Defences: the sandbox's own mount namespace on its overlay root (host paths
 * resolve inside it: absent), its own PID namespace (/proc/1 is its init, with the image env), and
 * the files API refusing /proc paths (400) and resolving everything else inside the root.
 *
 * The key is never sent into the sandbox (that would plant it): inside, a regex of the key's
 * shape is searched; the exact key is searched on the host side in a dump of everything the
 * sandbox can read.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { call } from '../helpers/wire.js';
import { assertBystanderUnaffected, attack, must, show, token } from './support/harness.js';

/** The API key's shape (dsec_ + 32 random bytes in base64url) as a regex that does not match itself. */
const KEY_SHAPE = 'dsec_[A-Za-z0-9_-]{43}';
const CANARY_VAR = 'DSEC_REDTEAM_CANARY';

describe('red team: secrets of the host and the control plane', { skip: integrationSkipReason(), timeout: 600_000 }, () => {
  let server: TestServer;
  let bystander: Sandbox;
  let sb: Sandbox;
  const canary = token('canary');
  let canaryBefore: string | undefined;

  /** Asserts none of the host's secrets appears in `text`. */
  function assertNoSecrets(where: string, text: string): void {
    assert.ok(!text.includes(server.apiKey), `${where}: the API key is readable from the sandbox`);
    assert.ok(!text.includes(canary), `${where}: the host process environment (canary ${CANARY_VAR}) leaked into the sandbox`);
  }

  before(async () => {
    canaryBefore = process.env[CANARY_VAR];
    process.env[CANARY_VAR] = canary; // before the server (in this process) starts and spawns anything
    server = await startTestServer();
    bystander = await Sandbox.create({ ...server.conn, labels: { role: 'bystander' } });
    sb = await Sandbox.create({ ...server.conn, labels: { role: 'attacker' }, env: { AGENT_TASK: 'read the secrets' } });
  });
  after(async () => {
    await server?.close();
    if (canaryBefore === undefined) delete process.env[CANARY_VAR];
    else process.env[CANARY_VAR] = canaryBefore;
  });

  test('read the control plane files (client.json, state.db, crun.log, the data dir) by their host paths or by name: absent', async () => {
    const paths = server.dsec.edge.records.paths(sb.id);
    for (const p of [
      `${server.dataDir}/client.json`,
      `${server.dataDir}/state.db`,
      `${server.dataDir}/dsec.pid`,
      paths.crunLog,
      paths.config,
      paths.state,
    ]) {
      const r = await attack(server, sb, ['cat', p]);
      assert.notEqual(r.exitCode, 0, `the sandbox read ${p}: ${show(r)}`);
      assert.match(r.stderr, /No such file or directory/, `${p}: ${show(r)}`);
      assertNoSecrets(`cat ${p}`, r.stdout + r.stderr);
    }
    const ls = await attack(server, sb, ['ls', server.dataDir]);
    assert.match(ls.stderr, /No such file or directory/, show(ls));
    const find = await must(
      server,
      sb,
      'find / -xdev \\( -name client.json -o -name state.db -o -name "state.db-*" -o -name crun.log -o -name dsec.pid -o -name "dsec-test-*" \\) -print',
      { timeoutMs: 120_000 },
    );
    assert.equal(find.stdout, '', `control-plane files are visible inside the sandbox: ${find.stdout}`);
    const logs = await attack(server, sb, 'ls /var/log 2>/dev/null; ls /run 2>/dev/null; true');
    assert.doesNotMatch(logs.stdout, /dsec|crun/, show(logs));
  });

  test('find the API key anywhere the sandbox can read (files, /proc/*/environ, cmdline, env): not there', async () => {
    // Inside: the key's shape, over the whole root and every process's environment and argv.
    const grep = await attack(
      server,
      sb,
      `find / -xdev -type f -exec grep -lE '${KEY_SHAPE}' {} + 2>/dev/null; ` +
        `grep -lE '${KEY_SHAPE}' /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null; ` +
        `grep -rlE '${KEY_SHAPE}' /dev/shm /dev/mqueue /tmp 2>/dev/null; env | grep -E '${KEY_SHAPE}|^DSEC_(API_KEY|URL|DATA_DIR)='; true`,
      { timeoutMs: 120_000 },
    );
    assert.equal(grep.timedOut, false, show(grep));
    assert.equal(
      grep.stdout,
      '',
      `something shaped like an API key, or a DSEC_API_KEY/DSEC_URL/DSEC_DATA_DIR variable (the SDK's connection settings), is readable inside: ${grep.stdout}`,
    );

    // Host side: everything readable, dumped, searched for the exact key.
    const dump = await attack(
      server,
      sb,
      'find / -xdev -type f -exec cat {} + 2>/dev/null; find /dev/shm /dev/mqueue -type f -exec cat {} + 2>/dev/null; ' +
        'cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline /proc/self/mountinfo 2>/dev/null; env; true',
      { timeoutMs: 120_000, maxOutputBytes: 64 << 20, encoding: 'base64' },
    );
    assert.equal(dump.truncated, false, `the dump was truncated at ${dump.stdoutBytes} bytes; the search would be incomplete`);
    const bytes = Buffer.from(dump.stdout, 'base64');
    assert.ok(bytes.length > 1_000_000, `the dump is implausibly small (${bytes.length} bytes): it should include /bin/busybox`);
    assert.equal(bytes.includes(server.apiKey), false, 'THE API KEY IS READABLE INSIDE THE SANDBOX');
    assert.equal(bytes.includes(canary), false, 'the host environment canary is readable inside the sandbox');
  });

  test('read the host /proc/1/environ: /proc/1 is the sandbox init (image env only); no host variable anywhere in the sandbox', async () => {
    const init = await must(server, sb, 'tr "\\0" " " < /proc/1/cmdline');
    assert.match(init.stdout, /^\/dev\/\.dsec-init -P/, `/proc/1 is not the sandbox init: ${init.stdout}`);
    // Each command runs in a Landlock domain of its own, so init's environ may be refused outright
    // (EACCES); whatever is readable must hold no secret.
    const environ = await attack(server, sb, 'tr "\\0" "\\n" < /proc/1/environ');
    assert.ok(environ.exitCode === 0 || /Permission denied/.test(environ.stderr), show(environ));
    assertNoSecrets('/proc/1/environ', environ.stdout);
    assert.doesNotMatch(
      environ.stdout,
      /^DSEC_(API_KEY|URL|DATA_DIR)=/m,
      `/proc/1/environ has the SDK's DSEC_ connection variables: ${environ.stdout}`,
    );
    const ps = await must(server, sb, 'ps -o pid,args');
    assert.doesNotMatch(ps.stdout, /node|crun|catatonit .*--|dockerd|containerd|sshd/, `host processes are visible: ${ps.stdout}`);
    const all = await must(server, sb, 'cat /proc/[0-9]*/environ 2>/dev/null | tr "\\0" "\\n"; env');
    assertNoSecrets('environments of every process', all.stdout);
    assert.match(all.stdout, /AGENT_TASK=read the secrets/, 'control: the sandbox env is what the caller set');

    // Other ways in: a shell session and a terminal get the same, clean environment.
    const session = await sb.sessions.create();
    const s = await session.run('env; tr "\\0" "\\n" < /proc/$$/environ');
    await session.close();
    assertNoSecrets('session env', s.stdout);
    let termOut = '';
    const term = await sb.terminal({
      cmd: ['/bin/sh', '-c', 'env; tr "\\0" "\\n" < /proc/1/environ'],
      onData: (d) => (termOut += Buffer.from(d).toString('utf8')),
    });
    await term.exited;
    assert.match(termOut, /PATH=/, `control: the terminal printed no environment: ${termOut}`);
    assertNoSecrets('terminal env', termOut);
  });

  test('read /proc through the files API (the server reads as root on the host): refused (400) or resolved inside (404), never the host', async () => {
    await must(server, sb, 'ln -sf /proc/1/environ /tmp/penv; ln -sfn /proc /tmp/proc; ln -sfn /proc/self /tmp/pself');
    const direct = [
      '/proc/1/environ',
      '/proc/self/environ',
      '/proc/self/root/etc/shadow',
      '//proc//self//environ',
      '/proc/../proc/1/environ',
      'proc/1/environ',
      '/sys/kernel/notes',
      '/dev/mem',
    ];
    const indirect = [
      '/tmp/../proc/self/environ',
      '/./proc/self/environ',
      '/tmp/penv',
      '/tmp/proc/self/environ',
      '/tmp/pself/environ',
      '/tmp/proc/1/environ',
    ];
    for (const path of [...direct, ...indirect]) {
      for (const route of ['files', 'files/stat']) {
        const res = await call(server, 'GET', `/v1/sandboxes/${sb.id}/${route}?path=${encodeURIComponent(path)}`, { timeoutMs: 30_000 });
        assertNoSecrets(`GET ${route} ${path}`, res.text);
        assert.ok(!/PATH=|HOME=/.test(res.text), `GET ${route} ${path} returned an environment: ${res.text.slice(0, 300)}`);
        if (direct.includes(path))
          assert.equal(
            res.status,
            400,
            `GET ${route} ${path}: expected 400 (the files API does not serve /proc, /sys, /dev), got ${res.status} ${res.text.slice(0, 200)}`,
          );
        else
          assert.ok(
            res.status === 404 || res.status === 400 || (route === 'files/stat' && res.status === 200),
            `GET ${route} ${path}: ${res.status} ${res.text.slice(0, 200)}`,
          );
      }
    }
    const list = await call(server, 'GET', `/v1/sandboxes/${sb.id}/files/list?path=${encodeURIComponent('/tmp/proc')}`);
    assert.ok(
      list.status === 404 || list.status === 400 || (list.status === 200 && !/"name":"1"|"name":"self"/.test(list.text)),
      `listing /tmp/proc showed a proc filesystem: ${list.text.slice(0, 300)}`,
    );
    const tar = await call(server, 'GET', `/v1/sandboxes/${sb.id}/files/tar?path=${encodeURIComponent('/proc/1/environ')}`);
    // Refused, or (tar runs inside the sandbox) at most the sandbox's own /proc: never the host's.
    assertNoSecrets('GET files/tar /proc/1/environ', tar.text);
  });

  test("a host user cannot read the control plane's secrets from the data dir: the store 0600, layers and images 0700, the dir unlistable (red team round three)", () => {
    // The state store holds the cluster token and E2B sandboxes' access tokens.
    for (const f of ['state.db', 'state.db-wal', 'client.json', 'cluster-token']) {
      const path = join(server.dataDir, f);
      if (!existsSync(path)) continue;
      assert.equal(statSync(path).mode & 0o077, 0, `${f} is ${(statSync(path).mode & 0o777).toString(8)}: readable by others`);
      const asNobody = spawnSync('setpriv', ['--reuid', '65534', '--regid', '65534', '--clear-groups', 'cat', path], { encoding: 'utf8' });
      assert.notEqual(asNobody.status, 0, `uid 65534 read ${f}`);
    }
    assert.equal(statSync(server.dataDir).mode & 0o777, 0o711, 'the data dir: passable, not listable, by others');
    // Private images' layers and records (red team round three, second pass: uid 65534 read a
    // project's snapshot from its layer file).
    for (const d of ['layers', 'images']) {
      assert.equal(statSync(join(server.dataDir, d)).mode & 0o777, 0o700, `${d}/`);
      assert.notEqual(
        spawnSync('setpriv', ['--reuid', '65534', '--regid', '65534', '--clear-groups', 'ls', join(server.dataDir, d)]).status,
        0,
        `uid 65534 listed ${d}/`,
      );
    }
    assert.notEqual(
      spawnSync('setpriv', ['--reuid', '65534', '--regid', '65534', '--clear-groups', 'ls', server.dataDir]).status,
      0,
      'uid 65534 listed the data dir',
    );
  });

  test('the bystander sandbox is unaffected', async () => {
    await assertBystanderUnaffected(server, bystander);
  });
});
