import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { readlinkSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { runToolOrThrow } from '../host/run-tool.js';
import { nft, nftInNetns, NftError } from './nftables.js';

const root = process.getuid?.() === 0;

describe('nftables in-process (libnftables)', { skip: root ? false : 'needs root (network namespaces, nftables)' }, () => {
  let holder: ChildProcess;
  const ownNetns = (): string => readlinkSync('/proc/thread-self/ns/net');
  const TABLE = `dsec_nfttest_${process.pid}`;

  before(async () => {
    // A process in a fresh network namespace of its own stands in for a sandbox's init.
    holder = spawn('unshare', ['--net', 'sleep', 'infinity'], { stdio: 'ignore' });
    await new Promise((r) => setTimeout(r, 200));
    assert.notEqual(readlinkSync(`/proc/${holder.pid}/ns/net`), ownNetns(), 'the holder did not get its own netns');
  });

  after(() => {
    holder.kill('SIGKILL');
  });

  test('a ruleset lands in the target netns only, and this thread comes back to its own', async () => {
    const home = ownNetns();
    nftInNetns(holder.pid!, `table inet ${TABLE} {\n  chain output {\n    type filter hook output priority 0; policy accept;\n  }\n}\n`);
    assert.equal(ownNetns(), home, 'the thread stayed in the sandbox netns');
    const inside = await runToolOrThrow('nsenter', [`--target=${holder.pid}`, '--net', '--', 'nft', 'list', 'tables']);
    assert.match(inside.stdout, new RegExp(`table inet ${TABLE}`));
    assert.doesNotMatch(nft('list tables'), new RegExp(TABLE), 'the table leaked into the host netns');
  });

  test("nft's own error text comes back, and a failed run also returns home", () => {
    const home = ownNetns();
    assert.throws(
      () => nftInNetns(holder.pid!, 'table inet x { chain y { no_such_statement } }'),
      (err: unknown) => err instanceof NftError && /syntax error/.test(err.message),
    );
    assert.equal(ownNetns(), home);
  });

  test('a process that is gone is an error, not a switch into the wrong namespace', () => {
    assert.throws(() => nftInNetns(2 ** 22 + 1, 'list tables'), /ENOENT/);
  });
});
