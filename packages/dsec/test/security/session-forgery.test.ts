/**
 * Red team, forged results (issue 10, High 1): a process an agent leaves running tries to decide
 * what a later command (a grader's, say) reports. The red team's job took the session shell's
 * stdin with pidfd_open + pidfd_getfd, read each later script and printed the end marker and
 * "5 passed" itself. Here the job an earlier command left takes the next command's stdout the
 * same way and writes "5 passed" into it, and reads the next command's memory through /proc,
 * in a session (opened with writablePaths, as in the repro) and in a plain exec. The later
 * command's exit status and output must be its own. What stops it: seccomp refuses pidfd_getfd
 * (and ptrace, process_vm_*); every command runs in a Landlock domain of its own, which a process
 * of another command cannot reach into (/proc/<pid>/mem, fd/, maps); and every session command is
 * a crun exec of its own whose status the edge reads from the kernel, not a line a shell prints.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { attack, must } from './support/harness.js';
import { NR, buildProbe } from './support/raw-syscall.js';
import { ISOLATE_COMMANDS } from '../../src/edge/backends/container/exec/exec-target.js';

/**
 * The job an earlier command leaves behind: wait for the next command to write its pid to
 * /tmp/victim.pid and for the test to hand over a probe aimed at it, then take the victim's
 * stdout with pidfd_open + pidfd_getfd and write "5 passed" into it (the red team's primitive),
 * and read the victim's memory through /proc. Each attempt is logged.
 */
const REACH_INTO_NEXT = `
i=0
while [ ! -e /tmp/probe.ready ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
p=$(cat /tmp/victim.pid)
echo "victim $p" >> /tmp/forge.log
/tmp/probe.bin > /tmp/probe.out 2>&1; echo "pidfd_getfd+write: exit $? steps $(cat /tmp/probe.out)" >> /tmp/forge.log
a=$(head -n 1 /proc/$p/maps 2>>/tmp/forge.log | cut -d- -f1)
if [ -n "$a" ] && dd if=/proc/$p/mem bs=1 skip=$((0x$a)) count=1 2>>/tmp/forge.log | od -An -tx1 | grep -q .; then
  echo "mem: read" >> /tmp/forge.log
else
  echo "mem: refused" >> /tmp/forge.log
fi
# A session command's status comes on its shell's fd 3 (session-state.ts saveScript): a status of
# 0 written there first would be read as the command's. While the command runs, the shell keeps
# that pipe on a higher fd (the command's own redirection 3>&-): every fd up to 63 is tried.
w=refused
for f in $(seq 3 63); do
  if (printf '0\\0/\\0' > /proc/$p/fd/$f) 2>/dev/null; then w="written (fd $f)"; fi
done
echo "fds: $(ls /proc/$p/fd 2>&1 | tr '\\n' ' ')" >> /tmp/forge.log
echo "fd3: $w" >> /tmp/forge.log
echo done >> /tmp/forge.log
`;

/**
 * The job an earlier session command leaves behind, aimed at the shell started ahead for the next
 * command (ShellSession.prepare), which waits for its program on a pipe: find it (a shell whose
 * argv is a session shell's, not the job's parent: the command that started it), then try to write a forged program into
 * its stdin through /proc, and to read its stdin. Each attempt is logged.
 */
const REACH_INTO_WAITING = `
me=$$
i=0; p=
while [ -z "$p" ] && [ $i -lt 200 ]; do
  for d in /proc/[0-9]*; do
    q=\${d#/proc/}
    [ "$q" = "$me" ] || [ "$q" = "$PPID" ] && continue
    case "$(tr '\\0' ' ' < $d/cmdline 2>/dev/null)" in "/bin/sh -s "|"/bin/bash --noprofile --norc -s ") p=$q;; esac
  done
  [ -z "$p" ] && sleep 0.05; i=$((i+1))
done
echo "waiting shell: \${p:-none}" >> /tmp/wait.log
if [ -n "$p" ]; then
  if (echo 'echo forged; exit 0' > /proc/$p/fd/0) 2>>/tmp/wait.log; then echo "write: done" >> /tmp/wait.log; else echo "write: refused" >> /tmp/wait.log; fi
  if timeout 1 cat /proc/$p/fd/0 >/tmp/wait.read 2>>/tmp/wait.log; then echo "read: done" >> /tmp/wait.log; else echo "read: refused" >> /tmp/wait.log; fi
fi
echo done >> /tmp/wait.log
`;

describe('red team: forged command results', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;

  before(async () => {
    server = await startTestServer();
    sb = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 128 } });
    await sb.files.write('/tmp/reach-into-next.sh', REACH_INTO_NEXT);
  });
  after(async () => {
    await server?.close();
  });

  test("a job left by one session command cannot write into, or read, the stdin of the next command's shell waiting ahead", async (t) => {
    await must(server, sb, 'rm -f /tmp/wait.log /tmp/wait.read');
    await sb.files.write('/tmp/reach-into-waiting.sh', REACH_INTO_WAITING);
    const s = await sb.sessions.create();
    try {
      const r1 = await s.run('sh /tmp/reach-into-waiting.sh >/dev/null 2>&1 & echo started');
      assert.equal(r1.exitCode, 0, JSON.stringify(r1));
      let log = '';
      for (let i = 0; i < 400 && !/done/.test(log); i++) {
        await new Promise((r) => setTimeout(r, 50));
        log = (await attack(server, sb, 'cat /tmp/wait.log 2>/dev/null')).stdout;
      }
      assert.match(log, /done/, `the job did not finish its attempts: ${log}`);
      t.diagnostic(`job log: ${log.trim().replace(/\n/g, ' | ')}`);
      if (!ISOLATE_COMMANDS) {
        assert.match(log, /waiting shell: none/, `no shell may wait between commands without a Landlock domain of its own: ${log}`);
        t.skip('this kernel has no Landlock ABI 2: no session shell is started ahead');
        return;
      }
      assert.match(log, /waiting shell: \d+/, `the job never found the shell waiting ahead: ${log}`);
      assert.match(log, /write: refused/, `the job wrote into the waiting shell's stdin: ${log}`);
      assert.match(log, /read: refused/, `the job read the waiting shell's stdin: ${log}`);
      const r2 = await s.run('echo own; exit 42');
      assert.equal(r2.exitCode, 42, `${JSON.stringify(r2)}; job log: ${log}`);
      assert.equal(r2.stdout, 'own\n', `the next command's output is not its own: ${JSON.stringify(r2.stdout)}; job log: ${log}`);
    } finally {
      await s.close().catch(() => undefined);
    }
  });

  async function forgeLog(): Promise<string> {
    return (await attack(server, sb, 'cat /tmp/forge.log 2>/dev/null')).stdout;
  }

  for (const where of ['session', 'exec'] as const) {
    test(`a job left by one command cannot forge the next command's output or exit status, nor read its memory (${where})`, async (t) => {
      await must(server, sb, 'rm -f /tmp/forge.log /tmp/victim.pid /tmp/probe.bin /tmp/probe.ready /tmp/probe.out');
      // As in the red team's repro: a session confined with writablePaths (it changes nothing here).
      const s = where === 'session' ? await sb.sessions.create({ writablePaths: ['/tmp'] }) : undefined;
      try {
        const first = 'sh /tmp/reach-into-next.sh >/dev/null 2>&1 & echo started';
        const r1 = s ? await s.run(first) : await attack(server, sb, first);
        assert.equal(r1.exitCode, 0, JSON.stringify(r1));
        // The victim (a grader's check, say) holds still while the job tries, then says "own" and exits 42.
        // In a session `(exit 42)`: the shell lives on and sends the status on its fd 3.
        const victim =
          'echo $$ > /tmp/victim.pid; i=0; while ! grep -q done /tmp/forge.log 2>/dev/null && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; echo own; ' +
          (s ? '(exit 42)' : 'exit 42');
        const pending = s ? s.run(victim, { timeoutMs: 60_000 }) : attack(server, sb, victim, { timeoutMs: 60_000 });
        let pid = '';
        for (let i = 0; i < 400 && !/^\d+$/.test(pid); i++) {
          await new Promise((r) => setTimeout(r, 50));
          pid = (await sb.files.exists('/tmp/victim.pid')) ? (await sb.files.readText('/tmp/victim.pid')).trim() : '';
        }
        assert.match(pid, /^\d+$/, 'the victim never started');
        const probe = buildProbe([
          { nr: NR.pidfd_open, args: [Number(pid), 0] },
          { nr: NR.pidfd_getfd, args: ['prev', 1, 0] },
          { nr: NR.write, args: ['prev', Buffer.from('5 passed\n'), 9] },
        ]);
        await sb.files.write('/tmp/probe.bin', probe, { mode: 0o755 });
        // Only once the write has closed the file: run while it is still open for writing, the
        // probe fails with ETXTBSY ("Text file busy"), which says nothing about the sandbox.
        await sb.files.write('/tmp/probe.ready', '');
        const r2 = await pending;
        const log = await forgeLog();
        t.diagnostic(`job log: ${log.trim().replace(/\n/g, ' | ')}`);
        assert.match(log, /victim \d+/, `the job never saw the victim: ${log}`);
        assert.match(log, /done/, `the job did not finish its attempts: ${log}`);
        assert.equal(r2.exitCode, 42, `${JSON.stringify(r2)}; job log: ${log}`);
        assert.equal(r2.stdout, 'own\n', `the job wrote into the victim's output: ${JSON.stringify(r2.stdout)}; job log: ${log}`);
        assert.match(log, /pidfd_getfd\+write: exit 1 steps AB$/m, `pidfd_getfd must be refused (EPERM): ${log}`);
        assert.match(log, /mem: refused/, log);
        assert.match(log, /fd3: refused/, `the job wrote into the victim's fd 3: ${log}`);
      } finally {
        await s?.close().catch(() => undefined);
      }
    });
  }
});
