import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { after, describe, test } from 'node:test';
import { NFT_HELPER_BINARY } from '../host/native-helpers.js';
import { runTool, runToolOrThrow } from '../host/run-tool.js';
import { linkFor } from './address-pool.js';
import { Nftables } from './nftables.js';
import { attachLink, detachLink, hostVeth } from './sandbox-network.js';

function skipReason(): string | false {
  if (process.getuid?.() !== 0) return 'needs root (network namespaces, veth)';
  if (!existsSync(NFT_HELPER_BINARY)) return `${NFT_HELPER_BINARY} is not built (run scripts/setup)`;
  return false;
}

/** `ip -j` output, parsed. */
async function ipJson<T>(args: string[], pid?: number): Promise<T> {
  const r =
    pid === undefined
      ? await runToolOrThrow('ip', ['-j', ...args])
      : await runToolOrThrow('nsenter', [`--target=${pid}`, '--net', '--', 'ip', '-j', ...args]);
  return JSON.parse(r.stdout) as T;
}

interface IpAddr {
  ifname: string;
  flags: string[];
  addr_info: { family: string; local: string; prefixlen: number }[];
}

describe('sandbox links over rtnetlink (dsec-nft)', { skip: skipReason() }, () => {
  const nft = new Nftables();
  const holders: ChildProcess[] = [];
  // Addresses from a /30 the pool itself would hand out; the test's ids keep its veth names apart from any edge's.
  const link = linkFor(16_000 + (process.pid % 100));
  const id = `linktest-${process.pid}`;

  /** A process in a fresh network namespace of its own stands in for a sandbox's init. */
  async function netnsHolder(): Promise<number> {
    const holder = spawn('unshare', ['--net', 'sleep', 'infinity'], { stdio: 'ignore' });
    holders.push(holder);
    for (let i = 0; i < 100; i++) {
      try {
        const ns = await runTool('readlink', [`/proc/${holder.pid}/ns/net`]);
        const mine = await runTool('readlink', ['/proc/self/ns/net']);
        if (ns.code === 0 && ns.stdout !== mine.stdout) return holder.pid!;
      } catch {
        // not yet
      }
      await new Promise((r) => setTimeout(r, 20));
    }
    throw new Error('unshare --net did not start');
  }

  after(async () => {
    for (const h of holders) h.kill('SIGKILL');
    await detachLink(id);
    await detachLink(`${id}-b`);
    await nft.close();
  });

  test('the pair is made: host end with its address, up, IPv6 off; eth0 inside with its address, up, default route via the host end', async () => {
    const pid = await netnsHolder();
    await attachLink(nft, id, pid, link);
    const h = hostVeth(id);
    const [host] = await ipJson<IpAddr[]>(['addr', 'show', 'dev', h]);
    assert.ok(host, `no host end ${h}`);
    assert.ok(host.flags.includes('UP'), `host end not up: ${host.flags.join(',')}`);
    assert.deepEqual(
      host.addr_info.map((a) => `${a.family} ${a.local}/${a.prefixlen}`),
      [`inet ${link.host}/30`],
      'host end: only its IPv4 address (no IPv6 link-local)',
    );
    assert.equal(readFileSync(`/proc/sys/net/ipv6/conf/${h}/disable_ipv6`, 'utf8').trim(), '1');
    const inside = await ipJson<IpAddr[]>(['addr', 'show', 'dev', 'eth0'], pid);
    assert.equal(inside.length, 1);
    assert.ok(inside[0]!.flags.includes('UP'));
    assert.ok(
      inside[0]!.addr_info.some((a) => a.family === 'inet' && a.local === link.sandbox && a.prefixlen === 30),
      JSON.stringify(inside),
    );
    const routes = await ipJson<{ dst: string; gateway?: string; dev: string }[]>(['route', 'show', 'default'], pid);
    assert.deepEqual(
      routes.map((r) => `${r.dst} via ${r.gateway} dev ${r.dev}`),
      [`default via ${link.host} dev eth0`],
    );
    // The link carries frames: the host end answers the sandbox's ARP request for its gateway
    // (ARP, because IP from a sandbox link to the host is what edges' host guard tables drop,
    // and other edges on this host may have theirs in place).
    const arp = await runTool('nsenter', [
      `--target=${pid}`,
      '--net',
      '--',
      'busybox',
      'arping',
      '-c',
      '1',
      '-w',
      '5',
      '-I',
      'eth0',
      link.host,
    ]);
    assert.equal(arp.code, 0, `arping from inside to the host end: ${arp.stdout}${arp.stderr}`);
  });

  test('all or nothing: a link that cannot be finished (eth0 taken inside) is an error, and no host end is left', async () => {
    const pid = await netnsHolder();
    await runToolOrThrow('nsenter', [
      `--target=${pid}`,
      '--net',
      '--',
      'ip',
      'link',
      'add',
      'eth0',
      'type',
      'veth',
      'peer',
      'name',
      'other0',
    ]);
    await assert.rejects(attachLink(nft, `${id}-b`, pid, linkFor(link.index + 1)), /veth dsh\w+: File exists|File exists/);
    assert.equal(existsSync(`/sys/class/net/${hostVeth(`${id}-b`)}`), false, 'the host end of the failed link is gone');
    // The helper keeps serving, from the host netns.
    assert.equal(typeof (await nft.run('list tables')), 'string');
  });

  test('a gone process and a malformed request are errors naming them', async () => {
    await assert.rejects(nft.addLink(2 ** 22 + 1, 'dshnope', '169.254.1.1', '169.254.1.2', 30), /cannot open \/proc\/4194305\/ns\/net/);
    await assert.rejects(nft.addLink(1, 'bad name; rm', '169.254.1.1', '169.254.1.2', 30), /malformed link/);
  });
});
