import { readFileSync, writeFileSync } from 'node:fs';
import { NftError, type Nftables } from './nftables.js';

/**
 * Host-side rules that hold whatever a sandbox's own policy says, in dsec's own nftables table:
 * nothing arriving from a sandbox link reaches a host service (the dsec API, sshd, …), no sandbox
 * reaches another sandbox, none reaches the metadata address; sandbox traffic leaving the host is
 * masqueraded. Installed when the first sandbox gets a link, removed when the edge stops.
 */
/** Each edge owns its own table, so edges sharing a host never remove each other's guard. */
export function guardTable(edgeId: string): string {
  return `dsec_host_${edgeId}`;
}

export function hostGuardRuleset(table: string): string {
  return [
    `table inet ${table}`,
    `delete table inet ${table}`,
    `table inet ${table} {`,
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
  readonly table: string;
  #installed = false;
  #forwardBefore: string | undefined;

  constructor(
    edgeId: string,
    private readonly nft: Nftables,
  ) {
    this.table = guardTable(edgeId);
  }

  /**
   * (Re)installs the table atomically. Run before every new link, not cached: whatever removed
   * the table meanwhile (an operator, a flush), the guard is back before a sandbox gets a link.
   */
  async ensure(): Promise<void> {
    await this.nft.run(hostGuardRuleset(this.table));
    if (!this.#installed) {
      const f = '/proc/sys/net/ipv4/ip_forward';
      this.#forwardBefore = readFileSync(f, 'utf8').trim();
      if (this.#forwardBefore !== '1') writeFileSync(f, '1');
      this.#installed = true;
    }
  }

  /** Removes this edge's table and restores ip_forward as it was (unless another edge still guards links). */
  async remove(): Promise<void> {
    try {
      await this.nft.run(`delete table inet ${this.table}`);
    } catch (err) {
      if (!(err instanceof NftError)) throw err; // not there: nothing to remove
    }
    if (!this.#installed) return;
    const others = (await this.nft.run('list tables')).includes('dsec_host_');
    if (!others && this.#forwardBefore !== undefined && this.#forwardBefore !== '1')
      writeFileSync('/proc/sys/net/ipv4/ip_forward', this.#forwardBefore);
    this.#installed = false;
  }
}
