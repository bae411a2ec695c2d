/**
 * Red team, network: a sandbox calls the control plane (forged RPC), scans the host and other
 * sandboxes, outlives a phase switch of its egress policy, injects raw frames past its own
 * nftables, and rides on a second dsec edge removing the host guard. Every attack must fail, and
 * each test names the defence that stopped it: the sandbox's own network namespace (loopback is
 * its own: "Connection refused"), no link at all under policy none ("Network is unreachable"),
 * the sandbox's nftables output chain (ICMP/UDP sends fail with "Operation not permitted"), and
 * the host guard table dsec_host (input from dsh* and dsh*→dsh* forwarding dropped: packets leave
 * the sandbox and are silently lost).
 *
 * All traffic stays on this machine: the sandbox links, a mirror in a network namespace this file
 * creates (on a link-local /30 dsec never uses) and the host's own addresses. Nothing is ever sent
 * to 169.254.169.254 (its drop rules are inspected instead).
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomBytes, randomInt } from 'node:crypto';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import type { ExecResult, NetworkPolicyResult } from '@dsec/sdk/schema';
import { guardTable, hostGuardRuleset } from '../../src/net/host-guard.js';
import { hostVeth } from '../../src/net/sandbox-network.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { assertBystanderUnaffected, attack, must, probeInSandbox, setNetwork, show } from './support/harness.js';
import {
  HostListeners,
  Mirror,
  assertHostGuardInPlace,
  hostCanConnect,
  hostGuardTable,
  hostSendUdp,
  hostStableAddresses,
  ifindexIn,
  ipv6RoutesOn,
  linkLocal6Of,
  macOf,
  runInNetns,
} from './support/net-lab.js';
import { buildProbe, rawIpSendSteps, rawIpv6MulticastSteps, routerAdvert, udpPacket } from './support/raw-syscall.js';

/** `nc` to ip:port with a connect timeout; returns the result (exit 0 only if it connected). */
function ncCmd(ipAddr: string, port: number, payload = ''): string {
  return `printf '${payload}' | nc -w 2 ${ipAddr} ${port}`;
}

const HTTP_GET = 'GET / HTTP/1.0\\r\\n\\r\\n';

describe('red team: network', { skip: integrationSkipReason(), timeout: 900_000 }, () => {
  let server: TestServer;
  let apiPort: number;
  let bystander: Sandbox;
  let listeners: HostListeners;
  let listeners6: HostListeners;
  let mirror: Mirror;
  /** Sandboxes with policy open (A, B) and their links. */
  let a: Sandbox;
  let b: Sandbox;
  let netA: NetworkPolicyResult;
  let netB: NetworkPolicyResult;

  before(async () => {
    listeners = await HostListeners.start('0.0.0.0');
    listeners6 = await HostListeners.start('::');
    mirror = await Mirror.start([8080, 8081], 9999);
    server = await startTestServer();
    apiPort = Number(new URL(server.url).port);
    bystander = await Sandbox.create({ ...server.conn, labels: { role: 'bystander' } });
    a = await Sandbox.create({ ...server.conn, labels: { role: 'attacker-a' } });
    b = await Sandbox.create({ ...server.conn, labels: { role: 'victim-b' } });
  });
  after(async () => {
    await server?.close();
    await mirror?.close();
    await listeners?.close();
    await listeners6?.close();
  });

  test('forged RPC, policy none: 127.0.0.1:<API port> is the sandbox own loopback (refused); host addresses are unreachable (no link)', async () => {
    // Defence: the sandbox's own network namespace with loopback only.
    const links = await must(server, a, 'ip -o link show; ip route');
    assert.doesNotMatch(links.stdout, /eth0|default/, `a sandbox with policy none has a link or a route: ${links.stdout}`);

    const local = await attack(server, a, ncCmd('127.0.0.1', apiPort, 'GET /v1/sandboxes HTTP/1.0\\r\\n\\r\\n'));
    assert.notEqual(local.exitCode, 0, `the sandbox reached 127.0.0.1:${apiPort}: ${show(local)}`);
    assert.match(local.stderr, /Connection refused/, `expected the sandbox's own loopback to refuse: ${show(local)}`);
    assert.doesNotMatch(local.stdout, /sandboxes|HTTP\//);

    const targets = [...hostStableAddresses(), mirror.hostAddress];
    for (const addr of targets) {
      for (const port of [apiPort, listeners.tcpPort]) {
        const r = await attack(server, a, ncCmd(addr, port));
        assert.notEqual(r.exitCode, 0, `the sandbox (policy none) reached the host at ${addr}:${port}: ${show(r)}`);
        assert.match(r.stderr, /Network is unreachable/, `${addr}:${port}: expected no route at all: ${show(r)}`);
      }
    }
    assert.deepEqual(listeners.connections, [], 'the host listener was reached');
  });

  test('forged RPC, policy open: the gateway and every host address drop the sandbox (sandbox ruleset for the gateway, host guard for the rest)', async () => {
    netA = await setNetwork(server, a.id, { mode: 'open' });
    assert.ok(netA.gateway && netA.address, `policy open gave no link: ${JSON.stringify(netA)}`);
    assertHostGuardInPlace('policy open');
    const gateway = netA.gateway;
    const hostAddrs = [...hostStableAddresses(), mirror.hostAddress];

    // Positive controls: the host listener does answer on each of these addresses (from the host).
    for (const addr of [gateway, ...hostAddrs])
      assert.ok(await hostCanConnect(addr, listeners.tcpPort), `control: host cannot reach its own listener on ${addr}`);
    const controlConnections = listeners.connections.length;

    for (const addr of [gateway, ...hostAddrs]) {
      for (const port of [apiPort, listeners.tcpPort]) {
        const r = await attack(server, a, ncCmd(addr, port, 'GET /v1/sandboxes HTTP/1.0\\r\\n\\r\\n'));
        assert.notEqual(r.exitCode, 0, `the sandbox reached the host at ${addr}:${port}: ${show(r)}`);
        assert.doesNotMatch(r.stdout, /HOST-LISTENER|HTTP\//, `${addr}:${port} answered`);
      }
    }
    assert.equal(
      listeners.connections.length,
      controlConnections,
      `the host listener accepted connections from the sandbox: ${JSON.stringify(listeners.connections)}`,
    );
    assert.ok(!listeners.connections.includes(netA.address!));

    // Which defence: ICMP to the gateway is refused by the sandbox's own output chain (EPERM at
    // send); ICMP to the host's other addresses leaves the sandbox and is dropped by the host guard.
    const pingGw = await attack(server, a, `ping -c 1 -W 2 ${gateway}`);
    assert.notEqual(pingGw.exitCode, 0, show(pingGw));
    // Without CAP_NET_RAW busybox ping cannot open its raw socket at all ("permission denied"):
    // no ICMP leaves; with a datagram ICMP socket the sandbox ruleset refuses the send (EPERM).
    assert.match(pingGw.stderr, /Operation not permitted|permission denied/, `gateway: expected the send to be refused: ${show(pingGw)}`);
    for (const addr of hostAddrs) {
      const p = await attack(server, a, `ping -c 1 -W 2 ${addr}`);
      assert.notEqual(p.exitCode, 0, `ICMP from the sandbox reached the host at ${addr}: ${show(p)}`);
      assert.match(
        `${p.stdout}${p.stderr}`,
        /100% packet loss|permission denied/,
        `${addr}: expected the packet to be lost (host guard) or never sent (no CAP_NET_RAW): ${show(p)}`,
      );
    }

    // The API itself listens on loopback only; the sandbox's 127.0.0.1 is its own.
    const local = await attack(server, a, ncCmd('127.0.0.1', apiPort));
    assert.match(local.stderr, /Connection refused/, show(local));
  });

  test('forged RPC over IPv6: the host end of the link (fe80::…%eth0) is unreachable (the sandbox ruleset drops all IPv6)', async () => {
    const ll = linkLocal6Of(hostVeth(a.id));
    if (!ll) return; // no IPv6 link-local on the host end: nothing to attack
    assert.ok(await hostCanConnect(`${ll}%${hostVeth(a.id)}`, listeners6.tcpPort), 'control: host cannot reach its own IPv6 listener');
    const before = listeners6.connections.length;
    const r = await attack(server, a, ncCmd(`${ll}%eth0`, listeners6.tcpPort));
    assert.notEqual(r.exitCode, 0, `the sandbox reached the host over IPv6: ${show(r)}`);
    const p = await attack(server, a, `ping -c 1 -W 2 ${ll}%eth0`);
    assert.notEqual(p.exitCode, 0, show(p));
    assert.match(
      p.stderr,
      /Operation not permitted|Cannot assign requested address/,
      `expected the send to be refused inside the sandbox: ${show(p)}`,
    );
    assert.equal(listeners6.connections.length, before, 'the IPv6 host listener accepted a connection from the sandbox');
  });

  test('port scan of the host and of another sandbox: policy none has no route; policy open cannot reach sandbox B (host guard drops dsh*→dsh*)', async () => {
    netB = await setNetwork(server, b.id, { mode: 'open' });
    assert.ok(netB.address);
    // Policy none (sandbox B's address from a sandbox with no link): no route.
    const none = await Sandbox.create({ ...server.conn, labels: { role: 'scanner-none' } });
    try {
      for (const [addr, port] of [
        [netB.address, 9000],
        [netA.gateway!, 22],
        [netB.gateway!, apiPort],
      ] as const) {
        const r = await attack(server, none, ncCmd(addr, port));
        assert.notEqual(r.exitCode, 0, show(r));
        assert.match(r.stderr, /Network is unreachable/, `${addr}:${port}: ${show(r)}`);
      }
    } finally {
      await none.kill();
    }

    assertHostGuardInPlace('two open sandboxes');
    const marker = `SCAN-${randomBytes(4).toString('hex')}`;
    // stdin kept open: busybox nc -l whose stdin is at EOF (/dev/null, a background process's
    // default) may end the connection before the client's bytes arrive, and the client, seeing
    // that end, exits without sending them: the listener exits 0 with empty output (measured
    // outside dsec too, 12 of 200 with /dev/null, 0 of 200 with an open stdin).
    const listener = await b.commands.start(['nc', '-l', '-p', '9000'], { stdin: true });
    // Scan B's ports and B's gateway from A.
    const scan = await attack(
      server,
      a,
      `for p in 22 80 443 9000 ${apiPort} ${listeners.tcpPort}; do printf '${marker}' | nc -w 1 ${netB.address} $p && echo OPEN-$p; printf x | nc -w 1 ${netB.gateway} $p && echo GWOPEN-$p; done; true`,
      { timeoutMs: 120_000 },
    );
    assert.doesNotMatch(scan.stdout, /OPEN-/, `the scan found open ports: ${show(scan)}`);
    // Which defence: ICMP to B leaves A (no EPERM) and is lost: the host guard's forward drop.
    const ping = await attack(server, a, `ping -c 1 -W 2 ${netB.address}`);
    assert.notEqual(ping.exitCode, 0, `A pinged B: ${show(ping)}`);
    // Sent and dropped by the host guard (100% loss), or not sent at all: no CAP_NET_RAW for ping.
    assert.match(
      `${ping.stdout}${ping.stderr}`,
      /100% packet loss|permission denied/,
      `expected the packet to be dropped or never sent: ${show(ping)}`,
    );
    // Positive control: B's listener was up all along, and got only the control's bytes.
    await must(server, b, `printf CONTROL | nc -w 2 127.0.0.1 9000`);
    const done = await listener.wait({ waitMs: 10_000 });
    const out = await listener.output();
    assert.equal(done.status, 'exited');
    assert.equal(out.stdout, 'CONTROL', `B's listener received data from A: ${JSON.stringify(out.stdout)}`);
  });

  test('phase switch: allow [mirror:8080] reaches the mirror, other ports do not; PUT none cuts it', async () => {
    const p = await Sandbox.create({
      ...server.conn,
      labels: { role: 'phase' },
      network: { mode: 'allow', allow: [`${mirror.address}:8080`] },
    });
    try {
      const get = (port: number): Promise<ExecResult> => attack(server, p, ncCmd(mirror.address, port, HTTP_GET));
      // Allowed: the mirror answers.
      const ok = await get(8080);
      assert.equal(ok.exitCode, 0, `the allowed mirror was not reachable: ${show(ok)}`);
      assert.match(ok.stdout, new RegExp(mirror.body));
      // Same mirror, another port (also served): not in the allow list.
      const other = await get(8081);
      assert.notEqual(other.exitCode, 0, `port 8081 was reachable with only :8080 allowed: ${show(other)}`);
      assert.doesNotMatch(other.stdout, new RegExp(mirror.body));
      const icmp = await attack(server, p, `ping -c 1 -W 2 ${mirror.address}`);
      assert.match(
        icmp.stderr,
        /Operation not permitted|permission denied/,
        `ICMP to the mirror should be refused (ruleset, or no raw socket): ${show(icmp)}`,
      );

      // Allow the whole address: 8081 now works (control: the previous failure was the port rule).
      await setNetwork(server, p.id, { mode: 'allow', allow: [mirror.address] });
      const wide = await get(8081);
      assert.equal(wide.exitCode, 0, `control: 8081 unreachable even with the address allowed: ${show(wide)}`);
      await setNetwork(server, p.id, { mode: 'allow', allow: [`${mirror.address}:8080`] });
      const narrowed = await get(8081);
      assert.notEqual(narrowed.exitCode, 0, `8081 still reachable after narrowing to :8080: ${show(narrowed)}`);
      assert.equal((await get(8080)).exitCode, 0, 'the narrowed policy lost the allowed port');

      // Phase switch to none: the same request is refused at once by the sandbox's ruleset (the
      // link stays, so that switching back is as fast; under none it carries nothing).
      const none = await setNetwork(server, p.id, { mode: 'none' });
      assert.equal(none.mode, 'none');
      const cut = await get(8080);
      assert.notEqual(cut.exitCode, 0, `the mirror was still reachable after PUT none: ${show(cut)}`);
      assert.match(cut.stderr, /Connection refused/, show(cut));
      assert.doesNotMatch(cut.stdout, new RegExp(mirror.body));
      // And back (a task's next setup phase): the kept link serves again.
      await setNetwork(server, p.id, { mode: 'allow', allow: [`${mirror.address}:8080`] });
      assert.equal((await get(8080)).exitCode, 0, 'switching back to allow did not restore the mirror');
    } finally {
      await p.kill();
    }
  });

  test('raw frames (AF_PACKET, CAP_NET_RAW) past the sandbox ruleset still cannot reach host services (host guard)', async () => {
    assertHostGuardInPlace('raw frames to the host');
    const ifindex = Number((await must(server, a, 'cat /sys/class/net/eth0/ifindex')).stdout.trim());
    const gwMac = macOf(hostVeth(a.id));
    const targets = [netA.gateway!, ...hostStableAddresses()];
    // Control: the UDP sink receives on each address when the host itself sends.
    for (const addr of targets) await hostSendUdp(addr, listeners.udpPort, `control-${addr}`);
    for (let i = 0; i < 50 && listeners.datagrams.length < targets.length; i++) await new Promise((r) => setTimeout(r, 100));
    assert.equal(listeners.datagrams.length, targets.length, `control: the UDP sink got ${JSON.stringify(listeners.datagrams)}`);

    const marker = `RAW-HOST-${randomBytes(4).toString('hex')}`;
    for (const addr of targets) {
      const pkt = udpPacket(netA.address!, addr, 40000, listeners.udpPort, Buffer.from(marker));
      const out = await probeInSandbox(server, a, rawIpSendSteps(pkt, ifindex, gwMac));
      // Either the sandbox cannot open a packet socket at all (no CAP_NET_RAW), or the frame left it.
      if (out.stepsStarted === 1) assert.equal(out.error, 'EPERM', `socket(AF_PACKET): ${JSON.stringify(out)}`);
      else assert.equal(out.error, 'OK', `sendto: ${JSON.stringify(out)}`);
    }
    await new Promise((r) => setTimeout(r, 1000)); // let any delivered datagram arrive
    const leaked = listeners.datagrams.filter((d) => d.data === marker);
    assert.deepEqual(leaked, [], `raw frames from the sandbox reached a host service: ${JSON.stringify(leaked)}`);
  });

  test('IPv6 router advertisement spoofing (AF_PACKET) at the host: dropped by the host guard, no route learnt on the sandbox link', async () => {
    assertHostGuardInPlace('router advertisement');
    // Four hex digits with no leading zero: `ip -6 route` prints each group without its leading
    // zeros (fd7e:0a1b:… as fd7e:a1b:…), so a random group that began with 0 (1 run in 16) made
    // the control never see its route and the attack's check pass whatever the host learnt.
    const prefixHex = randomInt(0x1000, 0x10000).toString(16);
    // Positive control: the same RA sent from the mirror's namespace is accepted by the host on the
    // mirror link (dsec's host-side veths accept RAs alike: accept_ra=1, IPv6 forwarding off).
    const controlPrefix = `fd7e:${prefixHex}:c::`;
    // Sent up to three times (a slow host's RA processing); the attack below is still sent once.
    let learnt = false;
    for (let send = 0; send < 3 && !learnt; send++) {
      const dir = mkdtempSync(join(tmpdir(), 'dsec-redteam-ra-'));
      try {
        const bin = join(dir, 'ra');
        writeFileSync(
          bin,
          buildProbe(rawIpv6MulticastSteps(routerAdvert('fe80::dead:beef', controlPrefix), ifindexIn(mirror.ns, mirror.peerIf))),
        );
        chmodSync(bin, 0o755);
        const sent = runInNetns(mirror.ns, bin);
        assert.equal(sent.status, 0, `control RA send: ${JSON.stringify(sent)}`);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
      for (let i = 0; i < 50 && !learnt; i++) {
        learnt = ipv6RoutesOn(mirror.hostIf).includes(`fd7e:${prefixHex}:c::/64`);
        if (!learnt) await new Promise((r) => setTimeout(r, 100));
      }
    }
    const controlOk = learnt;

    // The attack: the sandbox sends it on its own link.
    const dsh = hostVeth(a.id);
    const ifindex = Number((await must(server, a, 'cat /sys/class/net/eth0/ifindex')).stdout.trim());
    const ll = /^(fe80[0-9a-f]{28}) .* eth0$/m.exec((await must(server, a, 'cat /proc/net/if_inet6')).stdout)?.[1];
    const src = ll ? ll.match(/.{4}/g)!.join(':') : 'fe80::1';
    const attackPrefix = `fd7e:${prefixHex}:a::`;
    const out = await probeInSandbox(server, a, rawIpv6MulticastSteps(routerAdvert(src, attackPrefix), ifindex));
    await new Promise((r) => setTimeout(r, 1500));
    const routes = ipv6RoutesOn(dsh);
    assert.ok(
      !routes.includes(`fd7e:${prefixHex}:a::/64`),
      `the host learnt a route from the sandbox's router advertisement (probe ${out.error}): ${routes}`,
    );
    assert.ok(controlOk, 'control: the host did not accept the same RA from the mirror namespace, so this test proves nothing');
  });

  test('raw frames (AF_PACKET) do not bypass the allow list: a sandbox allowed only mirror:8080 cannot send UDP to mirror:9999', async () => {
    const p = await Sandbox.create({
      ...server.conn,
      labels: { role: 'raw-allow' },
      network: { mode: 'allow', allow: [`${mirror.address}:8080`] },
    });
    try {
      const net = await setNetwork(server, p.id, { mode: 'allow', allow: [`${mirror.address}:8080`] });
      assertHostGuardInPlace('raw frames past the allow list');
      // Control: the mirror's sink works; and an ordinary UDP send from the sandbox is refused.
      await hostSendUdp(mirror.address, 9999, 'control');
      for (let i = 0; i < 50 && !mirror.udpReceived().some((d) => d.data === 'control'); i++) await new Promise((r) => setTimeout(r, 100));
      assert.ok(
        mirror.udpReceived().some((d) => d.data === 'control'),
        'control: the mirror UDP sink did not receive from the host',
      );

      const ifindex = Number((await must(server, p, 'cat /sys/class/net/eth0/ifindex')).stdout.trim());
      const marker = `RAW-ALLOW-BYPASS-${randomBytes(4).toString('hex')}`;
      const pkt = udpPacket(net.address!, mirror.address, 40001, 9999, Buffer.from(marker));
      const out = await probeInSandbox(server, p, rawIpSendSteps(pkt, ifindex, macOf(hostVeth(p.id))));
      await new Promise((r) => setTimeout(r, 1000));
      const got = mirror.udpReceived().filter((d) => d.data === marker);
      assert.deepEqual(
        got,
        [],
        `ALLOW-LIST BYPASS: a sandbox with allow [${mirror.address}:8080] sent UDP to ${mirror.address}:9999 through an AF_PACKET socket ` +
          `(probe: ${JSON.stringify({ stepsStarted: out.stepsStarted, error: out.error })}). The allow list lives only in the sandbox's nftables ` +
          'output chain, which packet sockets bypass; the host forwards whatever arrives on dsh*.',
      );
    } finally {
      await p.kill();
    }
  });

  test('the metadata address 169.254.169.254 is dropped by both the sandbox ruleset and the host guard (rules inspected; no traffic sent there)', async () => {
    const pid = readFileSync(server.dsec.edge.records.paths(a.id).pidFile, 'utf8').trim();
    const r = spawnSync('nsenter', [`--target=${pid}`, '--net', '--', 'nft', 'list', 'table', 'inet', 'dsec'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /ip daddr \{[^}]*169\.254\.169\.254[^}]*\} drop/, `sandbox ruleset: ${r.stdout}`);
    assert.match(r.stdout, /meta nfproto ipv6 drop/);
    assertHostGuardInPlace('metadata');
    assert.match(hostGuardTable()!, /iifname "dsh\*" ip daddr 169\.254\.169\.254 drop/);
    // The sandbox cannot change its ruleset: no CAP_NET_ADMIN.
    const flush = await attack(server, a, 'ip link set eth0 down; ip route del default');
    assert.match(flush.stderr, /Operation not permitted/, show(flush));
  });

  test('the host guard holds while another dsec edge on the same host starts and stops', async () => {
    assertHostGuardInPlace('before the second edge');
    const addr = hostStableAddresses()[0] ?? mirror.hostAddress;
    const beforeCount = listeners.connections.length;
    let other: TestServer | undefined;
    let guardAfterStart: string | undefined;
    let reached: ReturnType<typeof show> | undefined;
    try {
      other = await startTestServer();
      guardAfterStart = hostGuardTable();
      // The attack while the guard may be gone: sandbox A (policy open) connects to a host listener.
      const r = await attack(server, a, ncCmd(addr, listeners.tcpPort));
      if (r.exitCode === 0 || listeners.connections.length > beforeCount) reached = show(r);
    } finally {
      await other?.close();
      // Leave the host as this file found it: the guard back in place for this server's sandboxes.
      if (hostGuardTable() === undefined) spawnSync('nft', ['-f', '-'], { input: hostGuardRuleset(guardTable(server.edgeId)) });
    }
    const problems: string[] = [];
    if (guardAfterStart === undefined) {
      problems.push(
        'starting a second dsec edge on this host (another data dir, no linked sandbox of its own) deleted the host-wide inet dsec_host table ' +
          'while this edge still had linked sandboxes (Edge.start → HostGuard.removeStale()); this edge never re-installs it (HostGuard.#installed stays true)',
      );
    }
    if (reached !== undefined)
      problems.push(`with the guard gone, sandbox A (policy open) connected to a host service at ${addr}:${listeners.tcpPort}: ${reached}`);
    assert.deepEqual(problems, [], problems.join('\n'));
  });

  test('the bystander sandbox is unaffected', async () => {
    await assertBystanderUnaffected(server, bystander);
  });
});
