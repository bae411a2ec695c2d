/**
 * Interactive terminals over WebSocket (SDK sb.terminal): a real pty inside the sandbox, the
 * initial size and resize (stty size), keystrokes including Ctrl-C, exit codes, and closing the
 * terminal killing its command.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { DsecError, Sandbox } from '@dsec/sdk';
import { useServerAndSandbox, type TestServer } from '../helpers/server.js';
import { engineBackends } from '../helpers/vm.js';
import { liveProcesses, pollUntil, waitGone } from './support/sandbox-procs.js';
import { TermCapture } from './support/term.js';

for (const { backend, skip, memoryMiB } of engineBackends())
  describe(`engine: pty terminals (${backend})`, { skip, timeout: 180_000 }, () => {
    let server: TestServer;
    let sb: Sandbox;

    useServerAndSandbox({ backend, resources: { memoryMiB } }, (s, b) => {
      server = s;
      sb = b;
    });

    test('the terminal starts with the requested size: stty size prints rows and cols', async () => {
      const cap = new TermCapture();
      const t = await sb.terminal({ cmd: ['/bin/sh'], cols: 100, rows: 30, onData: cap.onData });
      t.write('stty size\r');
      assert.ok(await cap.waitFor(/\b30 100\b/), `no "30 100" in: ${JSON.stringify(cap.text)}`);
      t.write('exit\r');
      assert.equal(await t.exited, 0);
    });

    test('resize changes the size the command sees: stty size shows the new rows and cols', async () => {
      const cap = new TermCapture();
      const t = await sb.terminal({ cmd: ['/bin/sh'], cols: 80, rows: 24, onData: cap.onData });
      t.write('stty size\r');
      assert.ok(await cap.waitFor(/\b24 80\b/), `initial size missing in: ${JSON.stringify(cap.text)}`);
      const mark = cap.text.length;
      t.resize(120, 40);
      t.write('stty size\r');
      assert.ok(await cap.waitFor(/\b40 120\b/, mark), `no "40 120" after resize in: ${JSON.stringify(cap.since(mark))}`);
      t.write('exit\r');
      await t.exited;
    });

    test('the command runs on a real terminal inside the sandbox (tty is /dev/pts/N, stdin is a tty)', async () => {
      const cap = new TermCapture();
      const t = await sb.terminal({ cmd: ['/bin/sh'], onData: cap.onData });
      t.write('tty; [ -t 0 ] && echo IS-A-TTY\r');
      assert.ok(await cap.waitFor(/\/dev\/pts\/\d+[\s\S]*IS-A-TTY\r?\n/), JSON.stringify(cap.text));
      t.write('exit\r');
      await t.exited;
    });

    test('the exit code of the command is propagated (exit 7 → 7)', async () => {
      const t = await sb.terminal({ cmd: ['/bin/sh'], onData: () => {} });
      t.write('exit 7\r');
      assert.equal(await t.exited, 7);
    });

    test('a command given as argv runs and its exit code is returned', async () => {
      const cap = new TermCapture();
      const t = await sb.terminal({ cmd: ['/bin/sh', '-c', 'echo argv-ok; exit 3'], onData: cap.onData });
      assert.equal(await t.exited, 3);
      assert.match(cap.text, /argv-ok/);
    });

    test('without cmd the terminal runs the image shell (sh on busybox)', async () => {
      const cap = new TermCapture();
      const t = await sb.terminal({ onData: cap.onData });
      t.write('echo "shell=$0"\r');
      assert.ok(await cap.waitFor(/shell=\S*sh\r?\n/), JSON.stringify(cap.text));
      t.write('exit 0\r');
      assert.equal(await t.exited, 0);
    });

    test('Ctrl-C interrupts the foreground command and the shell keeps going', async () => {
      const cap = new TermCapture();
      const t = await sb.terminal({ cmd: ['/bin/sh'], onData: cap.onData });
      t.write('sleep 5001\r');
      assert.ok(await pollUntil(async () => (await liveProcesses(sb, /^sleep 5001$/)).length > 0), 'sleep 5001 started');
      t.write('\x03');
      assert.deepEqual(await waitGone(sb, /^sleep 5001$/), [], 'Ctrl-C ended the sleep');
      const mark = cap.text.length;
      t.write('echo after-ctrl-c\r');
      assert.ok(await cap.waitFor(/after-ctrl-c\r?\n/, mark));
      t.write('exit\r');
      await t.exited;
    });

    test('closing the terminal (kill) ends its command and everything it started', async () => {
      const t = await sb.terminal({ cmd: ['/bin/sh'], onData: () => {} });
      t.write('sleep 5002 & sleep 5003\r');
      assert.ok(await pollUntil(async () => (await liveProcesses(sb, /^sleep 500[23]$/)).length === 2), 'both sleeps started');
      t.kill();
      await t.exited.catch(() => undefined);
      assert.deepEqual(await waitGone(sb, /^sleep 500[23]$/), []);
    });

    test('large output arrives complete through the terminal', async () => {
      const cap = new TermCapture();
      const t = await sb.terminal({ cmd: ['/bin/sh', '-c', 'seq 1 20000; echo END-OF-SEQ'], onData: cap.onData });
      assert.equal(await t.exited, 0);
      const lines = cap.text.split(/\r?\n/);
      assert.ok(
        lines.includes('20000') && lines.includes('10000') && lines.includes('END-OF-SEQ'),
        `output ends with ${JSON.stringify(cap.text.slice(-100))}`,
      );
    });

    test('a program that does not exist ends the terminal with a non-zero exit code', async () => {
      const t = await sb.terminal({ cmd: ['/no/such/program'], onData: () => {} });
      assert.notEqual(await t.exited, 0);
    });

    test('a terminal on an unknown sandbox fails with SANDBOX_NOT_FOUND', async () => {
      const ghost = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 64 } });
      await ghost.kill();
      let err: unknown;
      try {
        const t = await ghost.terminal({ cmd: ['/bin/sh'], onData: () => {} });
        await t.exited;
      } catch (e) {
        err = e;
      }
      assert.ok(err instanceof DsecError, `expected a DsecError, got ${String(err)}`);
      assert.equal(err.code, 'SANDBOX_NOT_FOUND');
    });

    test('a terminal session is logged in the trajectory as a non-replayable pty step with its exit code', async () => {
      const t = await sb.terminal({ cmd: ['/bin/sh', '-c', 'exit 5'], onData: () => {} });
      assert.equal(await t.exited, 5);
      let entry: Awaited<ReturnType<Sandbox['trajectory']>>['entries'][number] | undefined;
      await pollUntil(async () => {
        entry = (await sb.trajectory()).entries.filter((e) => e.kind === 'pty').at(-1);
        return entry?.exitCode === 5;
      });
      assert.ok(entry, 'a pty entry was logged');
      assert.equal(entry.exitCode, 5);
      assert.equal(entry.replayable, false);
      assert.deepEqual(entry.request['cmd'], ['/bin/sh', '-c', 'exit 5']);
    });
  });
