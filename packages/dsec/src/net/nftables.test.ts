import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { NFT_HELPER_BINARY } from '../host/native-helpers.js';
import { runToolOrThrow } from '../host/run-tool.js';
import { Nftables, NftError } from './nftables.js';

function skipReason(): string | false {
  if (process.getuid?.() !== 0) return 'needs root (network namespaces, nftables)';
  if (!existsSync(NFT_HELPER_BINARY)) return `${NFT_HELPER_BINARY} is not built (run scripts/setup)`;
  return false;
}

describe('nftables through dsec-nft', { skip: skipReason() }, () => {
  let holder: ChildProcess;
  const nft = new Nftables();
  const TABLE = `dsec_nfttest_${process.pid}`;
  const inside = async (): Promise<string> =>
    (await runToolOrThrow('nsenter', [`--target=${holder.pid}`, '--net', '--', 'nft', 'list', 'tables'])).stdout;

  before(async () => {
    // A process in a fresh network namespace of its own stands in for a sandbox's init.
    holder = spawn('unshare', ['--net', 'sleep', 'infinity'], { stdio: 'ignore' });
    await new Promise((r) => setTimeout(r, 200));
  });

  after(async () => {
    holder.kill('SIGKILL');
    await nft.run(`delete table inet ${TABLE}`).catch(() => undefined);
    await nft.close();
  });

  test('a ruleset lands in the target netns only', async () => {
    await nft.runInNetns(
      holder.pid!,
      `table inet ${TABLE} {\n  chain output {\n    type filter hook output priority 0; policy accept;\n  }\n}\n`,
    );
    assert.match(await inside(), new RegExp(`table inet ${TABLE}`));
    assert.doesNotMatch(await nft.run('list tables'), new RegExp(TABLE), 'the table leaked into the host netns');
  });

  test("nft's own error text comes back, and the helper keeps serving (and is back in the host netns)", async () => {
    await assert.rejects(
      () => nft.runInNetns(holder.pid!, 'table inet x { chain y { no_such_statement } }'),
      (err: unknown) => err instanceof NftError && /syntax error/.test(err.message),
    );
    // Host netns again: a table made with pid 0 is on the host, not in the sandbox.
    await nft.run(`table inet ${TABLE}\n`);
    assert.match(await nft.run('list tables'), new RegExp(TABLE));
    assert.doesNotMatch(await inside(), /table inet x\b/);
  });

  test('requests sent at once are answered in order, each with its own result', async () => {
    const results = await Promise.allSettled([
      nft.runInNetns(holder.pid!, 'list tables'),
      nft.runInNetns(holder.pid!, 'bogus'),
      nft.run('list tables'),
    ]);
    assert.equal(results[0].status, 'fulfilled');
    assert.match((results[0] as PromiseFulfilledResult<string>).value, new RegExp(TABLE));
    assert.equal(results[1].status, 'rejected');
    assert.equal(results[2].status, 'fulfilled');
  });

  test('a process that is gone is an error naming it, and the helper survives it', async () => {
    await assert.rejects(() => nft.runInNetns(2 ** 22 + 1, 'list tables'), /cannot open \/proc\/4194305\/ns\/net/);
    await assert.rejects(() => nft.runInNetns(0, 'list tables'), /no such process: 0/);
    assert.equal(typeof (await nft.run('list tables')), 'string');
  });

  test('a netns keeps one context across requests, let go by forget or once its process is gone: nothing of the netns is held after', async () => {
    const veth = `dnt${process.pid % 100000}`;
    const holdsVeth = (): boolean => existsSync(`/sys/class/net/${veth}`);
    const until = async (check: () => boolean): Promise<boolean> => {
      for (let i = 0; i < 200 && !check(); i++) await new Promise((r) => setTimeout(r, 10));
      return check();
    };
    for (const letGo of ['forget', 'gone'] as const) {
      const ns = spawn('unshare', ['--net', 'sleep', 'infinity'], { stdio: 'ignore' });
      try {
        await new Promise((r) => setTimeout(r, 200));
        await nft.addLink(ns.pid!, veth, '169.254.197.1', '169.254.197.2', 30);
        // Switches back and forth on one context: each request's output is its own.
        for (let i = 0; i < 6; i++) {
          await nft.runInNetns(
            ns.pid!,
            `table inet ${TABLE}\ndelete table inet ${TABLE}\ntable inet ${TABLE} {\n  chain c${i} {\n  }\n}\n`,
          );
          assert.equal((await nft.runInNetns(ns.pid!, `list table inet ${TABLE}`)).match(/chain c\d/g)?.join(), `chain c${i}`);
        }
      } finally {
        ns.kill('SIGKILL');
      }
      await new Promise<void>((r) => (ns.exitCode !== null || ns.signalCode !== null ? r() : ns.once('exit', () => r())));
      if (letGo === 'forget') {
        await nft.forget(ns.pid!); // as the edge does before a sandbox's teardown
      } else {
        await nft.run('list tables'); // any later request lets go of a netns whose process is gone
      }
      assert.ok(await until(() => !holdsVeth()), `after ${letGo}: the netns went, and its veth with it`);
    }
  });

  test('a helper that cannot start fails its requests with why, not a hang', async () => {
    const broken = new Nftables('/nonexistent/dsec-nft');
    await assert.rejects(() => broken.run('list tables'), /could not run/);
  });
});
