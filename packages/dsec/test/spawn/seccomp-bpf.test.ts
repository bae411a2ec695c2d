/**
 * The seccomp profile compiled once per edge (dsec-seccomp-bpf, libseccomp) and handed to crun
 * precompiled: the program must decide every call exactly as the one crun compiles from the
 * profile itself (it is laid out as a binary tree where crun's is a list, so the bytes differ),
 * and a sandbox running under it must refuse what the profile denies and run what it allows.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { SECCOMP_BPF_ANNOTATION } from '../../src/edge/backends/container/oci-config.js';
import { defaultSeccompProfile } from '../../src/edge/backends/container/seccomp.js';
import { compileSeccompProfile, profileLines } from '../../src/edge/backends/container/seccomp-bpf.js';
import { removeCgroupTreeSettled } from '../../src/host/cgroups.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { runSeccompFilter, x86Calls } from './support/classic-bpf.js';

const REFERENCE_CGROUP = `dsec-test-seccomp-ref-${process.pid}`;

describe('precompiled seccomp profile', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;
  let bpf: Buffer;

  before(async () => {
    server = await startTestServer();
    sb = await Sandbox.create({ ...server.conn });
    bpf = await compileSeccompProfile(defaultSeccompProfile());
  });
  after(async () => {
    await server?.close();
  });

  test('unit: the profile reaches the compiler element by element, in order', () => {
    const lines = profileLines({
      defaultAction: 'SCMP_ACT_ALLOW',
      architectures: ['SCMP_ARCH_X86_64', 'SCMP_ARCH_X32'],
      syscalls: [
        { names: ['mount', 'umount2'], action: 'SCMP_ACT_ERRNO', errnoRet: 1 },
        {
          names: ['clone'],
          action: 'SCMP_ACT_ERRNO',
          errnoRet: 1,
          args: [{ index: 0, value: 128, valueTwo: 128, op: 'SCMP_CMP_MASKED_EQ' }],
        },
      ],
    });
    assert.equal(
      lines,
      'default SCMP_ACT_ALLOW 1\narch x86_64\narch x32\nrule SCMP_ACT_ERRNO 1 mount\nrule SCMP_ACT_ERRNO 1 umount2\nrule SCMP_ACT_ERRNO 1 clone 0 SCMP_CMP_MASKED_EQ 128 128\n',
    );
  });

  test("a bad profile is refused with the compiler's reason", async () => {
    await assert.rejects(compileSeccompProfile({ defaultAction: 'SCMP_ACT_NOPE' }), /unknown default action: SCMP_ACT_NOPE/);
  });

  test("the sandbox gets the program through the annotation, deciding every call as crun's own compilation of the profile does", async () => {
    const crunRoot = join(server.dataDir, 'node', 'crun');
    const config = JSON.parse(readFileSync(join(crunRoot, sb.id, 'config.json'), 'utf8')) as {
      annotations?: Record<string, string>;
      linux: { seccomp?: unknown };
    };
    assert.equal(config.annotations?.[SECCOMP_BPF_ANNOTATION], bpf.toString('base64'), 'the edge handed crun its precompiled program');
    assert.equal(config.linux.seccomp, undefined, 'the profile itself is not handed to crun as well (crun would compile it)');
    assert.deepEqual(readFileSync(join(crunRoot, sb.id, 'seccomp.bpf')), bpf, 'crun loaded the program it was given');

    // crun's own compilation of the profile: `crun create` (which compiles and stores the program,
    // then waits for `start`) of a bundle over the sandbox's rootfs, with the profile and no annotation.
    const dir = join(server.dataDir, 'seccomp-reference');
    const root = join(dir, 'state');
    mkdirSync(root, { recursive: true });
    const id = `seccomp-ref-${process.pid}`;
    const rootfs = join(server.dataDir, 'node', 'sandboxes', sb.id, 'rootfs');
    writeFileSync(
      join(dir, 'config.json'),
      JSON.stringify({
        ociVersion: '1.0.2',
        process: { args: ['/bin/true'], cwd: '/', user: { uid: 0, gid: 0 }, noNewPrivileges: true },
        root: { path: rootfs, readonly: true },
        mounts: [{ destination: '/proc', type: 'proc', source: 'proc' }],
        linux: {
          namespaces: [{ type: 'pid' }, { type: 'mount' }, { type: 'network' }],
          cgroupsPath: `/${REFERENCE_CGROUP}/${id}`,
          seccomp: defaultSeccompProfile(),
        },
      }),
    );
    try {
      // The created container holds whatever stdio crun had until it ends: give it none, and read
      // crun's errors from its log.
      const log = join(dir, 'crun.log');
      try {
        execFileSync('crun', ['--root', root, `--log=file:${log}`, 'create', '--bundle', dir, id], { stdio: 'ignore' });
      } catch (err) {
        assert.fail(`crun create of the reference bundle failed: ${(err as Error).message}: ${readFileSync(log, 'utf8')}`);
      }
      const crunsOwn = readFileSync(join(root, id, 'seccomp.bpf'));
      assert.ok(bpf.length <= 4096 * 8, `the program fits the kernel's 4096 instructions (${bpf.length / 8})`);
      const differ: string[] = [];
      for (const call of x86Calls()) {
        const ours = runSeccompFilter(bpf, call);
        const theirs = runSeccompFilter(crunsOwn, call);
        if (ours !== theirs)
          differ.push(`${JSON.stringify(call, (_k, v: unknown) => (typeof v === 'bigint' ? v.toString(16) : v))}: ${ours} vs ${theirs}`);
      }
      assert.deepEqual(differ.slice(0, 10), [], `dsec-seccomp-bpf's program and crun's decide ${differ.length} calls differently`);
      // The comparison can tell programs apart: mount (165) is refused with EPERM, read (0) allowed,
      // clone (56) refused with CLONE_NEWUSER (0x10000000) and allowed without.
      const X86_64 = 0xc000003e;
      const [ERRNO_EPERM, ALLOW] = [0x00050001, 0x7fff0000];
      assert.equal(runSeccompFilter(bpf, { nr: 165, arch: X86_64 }), ERRNO_EPERM);
      assert.equal(runSeccompFilter(bpf, { nr: 0, arch: X86_64 }), ALLOW);
      assert.equal(runSeccompFilter(bpf, { nr: 56, arch: X86_64, args: [0x10000000n] }), ERRNO_EPERM);
      assert.equal(runSeccompFilter(bpf, { nr: 56, arch: X86_64, args: [0x11n] }), ALLOW);
    } finally {
      execFileSync('crun', ['--root', root, 'delete', '-f', id], { stdio: 'ignore' });
      rmSync(dir, { recursive: true, force: true });
      // Its killed init may take a moment to leave the cgroups crun made.
      assert.deepEqual(await removeCgroupTreeSettled(REFERENCE_CGROUP), [], "the reference container's cgroups are removed");
    }
  });

  test('under it a denied call is refused with EPERM and an allowed one works (test/security/kernel.test.ts probes every denied call)', async () => {
    const denied = await sb.commands.run(['sh', '-c', 'unshare -n true; echo status=$?']);
    assert.match(denied.stderr, /Operation not permitted/, `unshare: ${JSON.stringify(denied)}`);
    assert.match(denied.stdout, /status=1/);
    const mount = await sb.commands.run(['mount', '-t', 'tmpfs', 'x', '/mnt']);
    assert.notEqual(mount.exitCode, 0, `mount succeeded: ${JSON.stringify(mount)}`);
    // Allowed: processes (clone without namespace flags), files, the clock read.
    const ok = await sb.commands.run(['sh', '-c', 'echo hi > /tmp/f && cat /tmp/f && date +%s >/dev/null && (true) && echo done']);
    assert.equal(ok.exitCode, 0);
    assert.equal(ok.stdout, 'hi\ndone\n');
    const status = await sb.commands.run(['cat', '/proc/self/status']);
    assert.match(status.stdout, /^Seccomp:\s+2$/m);
  });
});
