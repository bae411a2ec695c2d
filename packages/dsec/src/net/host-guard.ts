import { readFileSync, writeFileSync } from 'node:fs';
import { runTool, runToolOrThrow } from '../host/run-tool.js';

/**
 * Host-side rules that hold whatever a sandbox's own policy says, in dsec's own nftables table:
 * nothing arriving from a sandbox link reaches a host service (the dsec API, sshd, …), no sandbox
 * reaches another sandbox, none reaches the metadata address; sandbox traffic leaving the host is
 * masqueraded. Installed when the first sandbox gets a link, removed when the edge stops.
 */
const TABLE = 'dsec_host';

export function hostGuardRuleset(): string {
  return [
    `table inet ${TABLE}`,
    `delete table inet ${TABLE}`,
    `table inet ${TABLE} {`,
    '  chain input {',
    '    type filter hook input priority -10; policy accept;',
    '    iifname "dsh*" drop',
    '  }',
    '  chain forward {',
    '    type filter hook forward priority -10; policy accept;',
    '    iifname "dsh*" oifname "dsh*" drop',
    '    iifname "dsh*" ip daddr 169.254.169.254 drop',
    '  }',
    '  chain postrouting {',
    '    type nat hook postrouting priority 100; policy accept;',
    '    iifname "dsh*" oifname != "dsh*" masquerade',
    '  }',
    '}',
    '',
  ].join('\n');
}

export class HostGuard {
  #installed = false;
  #forwardBefore: string | undefined;

  async ensure(): Promise<void> {
    if (this.#installed) return;
    await runToolOrThrow('nft', ['-f', '-'], { input: hostGuardRuleset() });
    const f = '/proc/sys/net/ipv4/ip_forward';
    this.#forwardBefore = readFileSync(f, 'utf8').trim();
    if (this.#forwardBefore !== '1') writeFileSync(f, '1');
    this.#installed = true;
  }

  /** Removes the table and restores ip_forward as it was. */
  async remove(): Promise<void> {
    if (!this.#installed) return;
    await runTool('nft', ['delete', 'table', 'inet', TABLE]);
    if (this.#forwardBefore !== undefined && this.#forwardBefore !== '1') writeFileSync('/proc/sys/net/ipv4/ip_forward', this.#forwardBefore);
    this.#installed = false;
  }

  /** A table left by a crashed edge (no sandbox link remains): remove it. */
  static async removeStale(): Promise<void> {
    await runTool('nft', ['delete', 'table', 'inet', TABLE]);
  }
}
