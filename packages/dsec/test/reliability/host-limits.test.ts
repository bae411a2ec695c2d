/**
 * `dsec doctor`'s host limits for a full node: each limit a node of N sandboxes needs is read,
 * reported with the command that raises it when it is short, and raised when doctor may fix.
 * The open-file limit of the dsec process is raised for real in a child process started with a
 * low limit (prlimit), so the host's own settings are not what is tested or changed.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { describe, test } from 'node:test';
import { HOST_LIMITS, hostLimitChecks, memcgCountCheck, readLimit, readNofile } from '../../src/host/host-limits.js';

const rootSkip = process.getuid?.() === 0 ? undefined : 'needs root (prlimit on a process, /proc/sys)';

describe('doctor: host limits of a full node', () => {
  test('every limit this kernel has is checked against what N sandboxes need, with its fix when short', () => {
    const checks = hostLimitChecks({ maxSandboxes: 2_000_000, fix: false });
    const present = HOST_LIMITS.filter((l) => readLimit(l.name) !== undefined);
    // Two million sandboxes need more than any limit a kernel allows (pid_max tops out at 4,194,304): every present limit is short and says how to raise it.
    for (const l of present) {
      const c = checks.find((x) => x.name.startsWith(`host limit ${l.name} `));
      assert.ok(c, `no check for ${l.name}`);
      assert.equal(c.ok, false, `${l.name}: ${c.detail}`);
      assert.equal(c.required, false);
      assert.match(c.detail, l.name === 'nofile' ? /ulimit -n \d+/ : new RegExp(`sysctl -w ${l.name.replaceAll('.', '\\.')}=\\d+`));
    }
    assert.match(checks.at(-1)!.detail, /> 65535/, 'two million memory cgroups cannot fit in 16-bit ids');
    // One sandbox fits within every default this kernel has, bar none.
    const small = hostLimitChecks({ maxSandboxes: 1, fix: false });
    assert.deepEqual(
      small.filter((c) => !c.ok).map((c) => c.detail),
      [],
    );
    assert.equal(memcgCountCheck(1).ok, true);
  });

  test(
    "doctor raises the dsec process's open-file limit (prlimit), or says how when it may not",
    { skip: rootSkip, timeout: 60_000 },
    () => {
      const mod = new URL('../../src/host/host-limits.js', import.meta.url).pathname;
      const script = `
      const { hostLimitChecks, readNofile } = await import(${JSON.stringify(mod)});
      const before = readNofile();
      const look = hostLimitChecks({ maxSandboxes: 100, fix: false }).find((c) => c.name.startsWith('host limit nofile'));
      const fixed = hostLimitChecks({ maxSandboxes: 100, fix: true }).find((c) => c.name.startsWith('host limit nofile'));
      console.log(JSON.stringify({ before, look, fixed, after: readNofile() }));
    `;
      // 100 sandboxes need 4,196 open files (1 each + 4,096); the child starts with 1,024, hard
      // limit too (Node raises its soft limit to the hard one at start, so only the hard one binds).
      const r = spawnSync('prlimit', ['--nofile=1024:1024', process.execPath, '--input-type=module', '-e', script], { encoding: 'utf8' });
      assert.equal(r.status, 0, r.stderr);
      const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as {
        before: { soft: number };
        look: { ok: boolean; detail: string };
        fixed: { ok: boolean; detail: string; fixed?: string };
        after: { soft: number; hard: number };
      };
      assert.equal(out.before.soft, 1024);
      assert.equal(out.look.ok, false);
      assert.match(out.look.detail, /1024 < 4196 needed.*ulimit -n 4196/);
      if (hasCapSysResource()) {
        assert.equal(out.fixed.ok, true, out.fixed.detail);
        assert.match(out.fixed.fixed ?? '', /raised nofile from 1024 to 4196/);
        assert.deepEqual(out.after, { soft: 4196, hard: 4196 });
      } else {
        // A container without CAP_SYS_RESOURCE (as here): nothing changes, and the check says why and what to run.
        assert.equal(out.fixed.ok, false);
        assert.match(out.fixed.detail, /could not raise it: .*CAP_SYS_RESOURCE.*run: ulimit -n 4196/);
        assert.deepEqual(out.after, { soft: 1024, hard: 1024 });
      }
      assert.ok(readNofile().soft >= 1024, "this process's own limit is untouched");
    },
  );
});

/** Whether this process has CAP_SYS_RESOURCE (bit 24 of CapEff), which raising a hard rlimit takes. */
function hasCapSysResource(): boolean {
  const eff = /^CapEff:\s+([0-9a-f]+)/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? '0';
  return (BigInt(`0x${eff}`) & (1n << 24n)) !== 0n;
}
