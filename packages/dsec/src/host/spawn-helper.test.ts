import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { SPAWN_HELPER_BINARY } from './native-helpers.js';
import { SpawnHelper, SpawnHelperError } from './spawn-helper.js';
import { ToolError, runTool, runToolOrThrow, startToolsThrough } from './run-tool.js';
import { PLAN_DATA_MAX, type HelperChild, type FdPlan } from './helper-child.js';

const skip = existsSync(SPAWN_HELPER_BINARY) ? false : `${SPAWN_HELPER_BINARY} is not built (run scripts/setup)`;

/** A streamed tool's exit status and everything it wrote on its output pipes (stdout, stderr, fd 3…). */
function collect(child: HelperChild): Promise<{ code: number | null; out: string[]; error?: string }> {
  const chunks = child.stdio.map(() => [] as Buffer[]);
  child.stdio.forEach((s, i) => i > 0 && s?.on('data', (d: Buffer) => chunks[i]!.push(d)));
  return new Promise((resolve) => {
    child.once('error', (err: Error) => resolve({ code: null, out: [], error: err.message }));
    child.once('close', (code: number) => resolve({ code, out: chunks.map((c) => Buffer.concat(c).toString()) }));
  });
}

/** Waits until `check` holds (a file a tool writes), polling; gives up after `tries`. */
async function until(check: () => boolean, tries = 3000): Promise<boolean> {
  for (let i = 0; i < tries && !check(); i++) await new Promise((r) => setTimeout(r, 10));
  return check();
}

describe('dsec-spawn: host tools started by a resident helper', { skip }, () => {
  const helper = new SpawnHelper();
  const dir = mkdtempSync(join(tmpdir(), 'dsec-unit-spawn-'));
  after(async () => {
    await helper.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test("exit status, stdout and stderr are the tool's own; a signal is 128 + its number; a missing tool is 127 with why", async () => {
    assert.deepEqual(await helper.run('sh', ['-c', 'echo out; echo err >&2; exit 3'], { stdio: 'pipe' }), {
      code: 3,
      stdout: 'out\n',
      stderr: 'err\n',
    });
    assert.equal((await helper.run('sh', ['-c', 'kill -TERM $$'], { stdio: 'pipe' })).code, 128 + 15);
    assert.equal((await helper.run('sh', ['-c', 'kill -KILL $$'], { stdio: 'pipe' })).code, 128 + 9);
    const missing = await helper.run('/no/such/tool', [], { stdio: 'pipe' });
    assert.equal(missing.code, 127);
    assert.match(missing.stderr, /cannot start \/no\/such\/tool: No such file or directory/);
    // Arguments arrive as they are: spaces, quotes, newlines, empty ones.
    const args = ['a b', "'q'", 'line\nbreak', '', '$HOME'];
    const echoed = await helper.run('sh', ['-c', 'for a in "$@"; do printf "[%s]" "$a"; done', 'sh', ...args], { stdio: 'pipe' });
    assert.equal(echoed.stdout, args.map((a) => `[${a}]`).join(''));
  });

  test('calls in flight at once each get their own answer, whichever finishes first', async () => {
    const slow = helper.run('sh', ['-c', `while [ ! -e ${dir}/go ]; do sleep 0.01; done; echo slow`], { stdio: 'pipe' });
    const fast = await helper.run('sh', ['-c', `echo fast; touch ${dir}/go`], { stdio: 'pipe' });
    assert.equal(fast.stdout, 'fast\n');
    assert.equal((await slow).stdout, 'slow\n');
  });

  test('output beyond 1 MiB is cut, not blocking the tool', async () => {
    const r = await helper.run('sh', ['-c', 'head -c 3000000 /dev/zero; echo done >&2'], { stdio: 'pipe' });
    assert.equal(r.code, 0);
    assert.equal(r.stdout.length, 1 << 20);
    assert.equal(r.stderr, 'done\n');
  });

  test("with stdio ignored a process the tool leaves behind (as crun run -d leaves a container) holds none of the helper's pipes", async () => {
    const pidFile = join(dir, 'sleeper.pid');
    const r = await helper.run('sh', ['-c', `sleep 1000 & echo $! > ${pidFile}`], { stdio: 'ignore' });
    assert.equal(r.code, 0);
    const pid = Number(readFileSync(pidFile, 'utf8'));
    try {
      assert.ok(existsSync(`/proc/${pid}`), 'the call was answered while the process it left still runs');
    } finally {
      process.kill(pid, 'SIGKILL');
    }
  });

  test('streamed: the tool writes to pipes the edge reads as it runs, reads a stdin the edge writes (8 MiB, whole), and gets a host file as an extra fd', async () => {
    const file = join(dir, 'extra-fd');
    writeFileSync(file, '');
    const plan: FdPlan[] = ['in', 'out', 'out', 'out', { write: file }];
    const child = helper.stream('sh', ['-c', 'wc -c; echo err >&2; echo three >&3; echo four >&4; exit 5'], plan);
    const done = collect(child);
    child.stdin!.end(Buffer.alloc(8 << 20, 97));
    const r = await done;
    assert.equal(r.code, 5);
    assert.deepEqual(
      r.out.slice(1, 4).map((o) => o.trim()),
      ['8388608', 'err', 'three'],
    );
    assert.equal(readFileSync(file, 'utf8'), 'four\n');
  });

  test('streamed: output written by a tool that exits at once is not lost (the helper holds the pipes until the edge has them)', async () => {
    for (let i = 0; i < 20; i++) {
      const r = await collect(helper.stream('sh', ['-c', `echo run ${i}`], ['null', 'out', 'out']));
      assert.deepEqual(r, { code: 0, out: ['', `run ${i}\n`, ''] });
    }
  });

  test('streamed: kill() signals the tool (128 + the signal), its pipes are not in any other tool, a missing tool or file is an error with why', async () => {
    const child = helper.stream('sh', ['-c', 'ls /proc/self/fd; exec sleep 1000'], ['null', 'out', 'out']);
    const done = collect(child);
    await new Promise<void>((resolve) => child.stdout!.once('data', () => resolve()));
    assert.equal(child.kill('SIGTERM'), true);
    const r = await done;
    assert.equal(r.code, 128 + 15);
    // 0, 1, 2 and ls's own directory fd: none of the helper's other pipes leak into a tool.
    assert.deepEqual(
      r.out[1]!.trim()
        .split(/\s+/)
        .map(Number)
        .filter((fd) => fd > 3 && fd < 200),
      [],
    );
    assert.match(
      (await collect(helper.stream('/no/such/tool', [], ['null', 'out', 'out']))).error ?? '',
      /cannot start \/no\/such\/tool: No such file or directory/,
    );
    assert.match(
      (await collect(helper.stream('true', [], ['null', 'out', 'out', { write: join(dir, 'no', 'such') }]))).error ?? '',
      /cannot open .*no\/such: No such file or directory/,
    );
  });

  test('streamed: a stdin given whole at the start ({ data }) is what the tool reads, to its end, bytes as they are', async () => {
    const data = Buffer.concat([Buffer.from('line one\n\0two\xff'), Buffer.alloc(PLAN_DATA_MAX - 16, 0x61)]);
    for (const bytes of [data, Buffer.alloc(0), Buffer.from('x')]) {
      const child = helper.stream('sh', ['-c', 'od -An -v -tx1 | tr -d " \\n"'], [{ data: bytes }, 'out', 'out']);
      assert.equal(child.stdin, null, 'the edge has no stdin pipe to write');
      const r = await collect(child);
      assert.equal(r.code, 0, r.out[2]);
      assert.equal(r.out[1], bytes.toString('hex'));
    }
    // More than a pipe takes without a reader is refused (the edge sends it through an `in` pipe).
    const tooLong = await collect(helper.stream('cat', [], [{ data: Buffer.alloc(PLAN_DATA_MAX + 1) }, 'out', 'out']));
    assert.match(tooLong.error ?? '', /too long data/);
  });

  test('streamed: the edge holds no fd of a tool once it has exited, even a stdin it never ended (as a ChildProcess)', async () => {
    const fds = (): number => readdirSync('/proc/self/fd').length;
    const before = fds();
    for (let i = 0; i < 20; i++) {
      const child = helper.stream('cat', [], ['in', 'out', 'out']);
      const done = collect(child);
      child.stdin!.write('never ended\n');
      await new Promise<void>((resolve) => child.stdout!.once('data', () => resolve()));
      child.kill('SIGKILL');
      assert.equal((await done).code, 128 + 9);
    }
    await new Promise((r) => setImmediate(r));
    assert.ok(fds() - before < 5, `fds went from ${before} to ${fds()}`);
  });

  test("streamed: more tools than the first helper allowed (1,024) run at once, as a node's background commands do", async () => {
    const children = Array.from({ length: 1100 }, () => helper.stream('sleep', ['1000'], ['null', 'null', 'null']));
    try {
      await Promise.all(
        children.map(
          (c) =>
            new Promise<void>((resolve, reject) => {
              c.once('spawn', () => resolve());
              c.once('error', reject);
            }),
        ),
      );
    } finally {
      for (const c of children) c.kill('SIGKILL');
    }
    const codes = await Promise.all(
      children.map((c) => (c.exitCode !== null ? c.exitCode : new Promise<number>((r) => c.once('exit', (code: number) => r(code))))),
    );
    assert.deepEqual(new Set(codes), new Set([128 + 9]));
  });

  test('a helper that dies fails the calls in flight (their tools run on) and the next call starts a new one', async () => {
    const first = helper.pid ?? (await helper.run('true', [], { stdio: 'pipe' }), helper.pid);
    assert.ok(first);
    const started = join(dir, 'started');
    const marker = join(dir, 'finished');
    const inFlight = helper.run('sh', ['-c', `touch ${started}; while [ ! -e ${dir}/release ]; do sleep 0.01; done; touch ${marker}`], {
      stdio: 'ignore',
    });
    // Killed while the tool runs (not before the helper has read the request: then no tool ran at all).
    assert.ok(await until(() => existsSync(started)), 'the tool started');
    process.kill(first, 'SIGKILL');
    await assert.rejects(inFlight, (err: unknown) => err instanceof SpawnHelperError && /exited \(SIGKILL\)/.test(err.message));
    writeFileSync(join(dir, 'release'), '');
    assert.ok(await until(() => existsSync(marker)), 'the tool finished although its helper died');
    assert.equal((await helper.run('sh', ['-c', 'echo again'], { stdio: 'pipe' })).stdout, 'again\n');
    assert.notEqual(helper.pid, first);
  });

  test('a helper that cannot start fails its calls with why, not a hang', async () => {
    const broken = new SpawnHelper('/nonexistent/dsec-spawn');
    await assert.rejects(broken.run('true', [], { stdio: 'pipe' }), /could not run/);
  });
});

describe('runTool through a registered dsec-spawn (startToolsThrough)', { skip }, () => {
  test('plain calls are started by the helper, calls with stdin, env, cwd or a signal by this process, and none after it is unregistered', async () => {
    const helper = new SpawnHelper();
    const stop = startToolsThrough(helper);
    try {
      const viaHelper = await runTool('sh', ['-c', 'echo $PPID; echo err >&2; exit 3']);
      assert.deepEqual(viaHelper, { code: 3, stdout: `${helper.pid}\n`, stderr: 'err\n' });
      assert.equal((await runTool('sh', ['-c', 'cat >/dev/null; echo $PPID'], { input: 'x' })).stdout, `${process.pid}\n`);
      assert.equal((await runTool('sh', ['-c', 'echo $PPID'], { cwd: '/' })).stdout, `${process.pid}\n`);
      assert.equal((await runTool('sh', ['-c', 'echo $PPID'], { signal: new AbortController().signal })).stdout, `${process.pid}\n`);
      assert.equal((await runTool('sh', ['-c', 'head -c 5000 /dev/zero | tr "\\0" x'], { maxOutput: 10 })).stdout, 'xxxxxxxxxx');
      await assert.rejects(
        runToolOrThrow('sh', ['-c', 'echo bad >&2; exit 2']),
        (err: unknown) => err instanceof ToolError && /exited 2: bad/.test(err.message),
      );
    } finally {
      stop();
    }
    assert.equal((await runTool('sh', ['-c', 'echo $PPID'])).stdout, `${process.pid}\n`);
    await helper.close();
  });

  test('a helper that dies under a call answers 127 with the reason, and the tool is not started again', async () => {
    const helper = new SpawnHelper();
    const stop = startToolsThrough(helper);
    const dir = mkdtempSync(join(tmpdir(), 'dsec-unit-starter-'));
    try {
      const marks = join(dir, 'runs');
      const pending = runTool('sh', ['-c', `echo $$ >> ${marks}; exec sleep 30`]);
      assert.ok(await until(() => existsSync(marks)));
      process.kill(helper.pid!, 'SIGKILL');
      const r = await pending;
      assert.equal(r.code, 127);
      assert.match(r.stderr, /its starter failed/);
      const runs = readFileSync(marks, 'utf8').trim().split('\n');
      assert.equal(runs.length, 1);
      process.kill(Number(runs[0]), 'SIGKILL'); // the orphaned tool, not left to sleep on
      assert.equal((await runTool('sh', ['-c', 'echo $PPID'])).stdout, `${helper.pid}\n`); // a new helper took over
    } finally {
      stop();
      await helper.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe(
  'dsec-spawn: a tool started from the template mount namespace with dirs carried in (crun run -d)',
  { skip: skip || (process.getuid?.() !== 0 ? 'needs root (mount namespaces)' : false) },
  () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsec-unit-carry-'));
    const said: string[] = [];
    const helper = new SpawnHelper(SPAWN_HELPER_BINARY, { template: [dir], onCarryFailed: (why) => said.push(why) });
    const plain = new SpawnHelper(SPAWN_HELPER_BINARY, { onCarryFailed: (why) => said.push(why) });
    after(async () => {
      await helper.close();
      await plain.close();
      rmSync(dir, { recursive: true, force: true });
    });

    test("the tool runs in a mount namespace other than the edge's and sees a carried dir as the edge does; one that cannot be carried runs as before, said once", async () => {
      mkdirSync(join(dir, 'bundle'));
      writeFileSync(join(dir, 'bundle', 'f'), 'carried\n');
      const own = readlinkSync('/proc/self/ns/mnt');
      const r = await helper.runCarried('sh', ['-c', `readlink /proc/self/ns/mnt; cat ${dir}/bundle/f; exit 4`], [join(dir, 'bundle')], {
        stdio: 'pipe',
      });
      assert.equal(r.code, 4, r.stderr);
      const [ns, text] = r.stdout.split('\n');
      assert.notEqual(ns, own, "not the edge's mount namespace");
      assert.equal(text, 'carried');
      assert.deepEqual(said, []);
      const missing = join(dir, 'gone');
      for (let i = 0; i < 2; i++) {
        const again = await helper.runCarried('sh', ['-c', 'readlink /proc/self/ns/mnt'], [missing], { stdio: 'pipe' });
        assert.deepEqual(again, { code: 0, stdout: `${own}\n`, stderr: '' }, "run as run() does, in the edge's namespace");
      }
      assert.equal(said.length, 1, 'said once');
      assert.match(said[0]!, new RegExp(`^dsec-spawn: cannot carry: open_tree ${missing}: No such file or directory`));
    });

    test('the tool has a procfs of its own at /proc (crun writes sysctls through it), with the same processes', async () => {
      // mountinfo's first field is the mount's id: the edge's /proc and the tool's are other mounts.
      const procMount = (mountinfo: string): string | undefined =>
        mountinfo
          .split('\n')
          .filter((l) => l.split(' ')[4] === '/proc' && l.includes(' - proc '))
          .at(-1)
          ?.split(' ')[0];
      const r = await helper.runCarried('sh', ['-c', 'cat /proc/self/mountinfo; echo ---; cat /proc/1/comm'], [dir], { stdio: 'pipe' });
      assert.equal(r.code, 0, r.stderr);
      const [mountinfo = '', comm] = r.stdout.split('---\n');
      const theirs = procMount(mountinfo);
      assert.ok(theirs, `no proc mount at /proc in:\n${mountinfo}`);
      assert.notEqual(theirs, procMount(readFileSync('/proc/self/mountinfo', 'utf8')), "the template's (the edge's) /proc");
      assert.equal(comm, readFileSync('/proc/1/comm', 'utf8'), "the host's pid namespace");
    });

    test('a helper started without a template runs the tool as before and says why', async () => {
      said.length = 0;
      const r = await plain.runCarried('sh', ['-c', 'readlink /proc/self/ns/mnt'], [dir], { stdio: 'pipe' });
      assert.deepEqual(r, { code: 0, stdout: `${readlinkSync('/proc/self/ns/mnt')}\n`, stderr: '' });
      assert.deepEqual(said, [
        'dsec-spawn: cannot carry: no template mount namespace: not asked for (dsec-spawn started without --template)',
      ]);
    });
  },
);
