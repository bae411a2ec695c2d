import { randomBytes } from 'node:crypto';
import {
  closeSync,
  fstatSync,
  linkSync,
  mkdirSync,
  openSync,
  readFileSync,
  readdirSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { HostNotReadyError } from './host-not-ready.js';

/**
 * Host-wide claims between dsec edges that share one machine (the cluster's tests run three on
 * one host; a node may run several): an edge id, the link-local address blocks its sandbox
 * links use, and the host uid ranges of its user-namespaced sandboxes. A claim is a file created exclusively (a hard link that fails if it exists) under /run/dsec, naming its owner.
 * It is stale when written in an earlier boot (no sandbox survives a reboot) and, for an edge id
 * lock, when its process is gone. A claim is never seen half-written (createWhole; a hand-over
 * renames a whole new claim over the old). One process may hold several edges (tests): it remembers which
 * ids it holds, so a claim by this pid for an id it no longer holds is stale too.
 */
export const CLAIMS_DIR = process.env['DSEC_CLAIMS_DIR'] ?? '/run/dsec';

const bootId = ((): string => {
  try {
    return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
  } catch {
    return 'unknown';
  }
})();

interface Claim {
  owner: string;
  pid: number;
  boot: string;
}

function readClaim(path: string): Claim | undefined {
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as Claim;
  } catch {
    return undefined; // gone, or a half-written file: treated as stale
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Creates `path` exclusively for `owner`. An existing claim is taken over when `stale(claim)`
 * says so (or it was written in another boot); otherwise its owner is returned.
 */
function claim(path: string, owner: string, stale: (c: Claim) => boolean): { ok: true } | { ok: false; holder: Claim } {
  mkdirSync(join(path, '..'), { recursive: true, mode: 0o700 });
  const mine: Claim = { owner, pid: process.pid, boot: bootId };
  for (let attempt = 0; attempt < 5; attempt++) {
    if (createWhole(path, JSON.stringify(mine))) return { ok: true };
    const read = readClaimFile(path);
    // Gone since the link failed (released): try the link again. Never remove what was not read
    // as stale: that could be a claim another claimant has just made.
    if (!read) continue;
    const holder = read.claim;
    if (holder && holder.boot === bootId && !stale(holder)) return { ok: false, holder };
    removeIfSame(path, read.ino); // stale (or unreadable): remove that very file and try again
  }
  const holder = readClaim(path);
  return holder ? { ok: false, holder } : { ok: false, holder: { owner: 'unknown', pid: 0, boot: bootId } };
}

/** A claim file's inode and its claim (undefined when it is not one); undefined when there is no file. */
function readClaimFile(path: string): { ino: number; claim: Claim | undefined } | undefined {
  let fd: number;
  try {
    fd = openSync(path, 'r');
  } catch {
    return undefined;
  }
  try {
    const ino = fstatSync(fd).ino;
    try {
      return { ino, claim: JSON.parse(readFileSync(fd, 'utf8')) as Claim };
    } catch {
      return { ino, claim: undefined };
    }
  } finally {
    closeSync(fd);
  }
}

/**
 * Removes `path` if it is still the file (inode `ino`) that was read as stale. Between that read
 * and a plain unlink, another claimant may have removed the stale claim and linked its own: the
 * unlink would take that live claim away and two owners would hold one slot (seen with three
 * processes claiming and releasing one slot: 121 holds of 14,481 lost). So the file is renamed
 * aside first, which takes whatever is at `path` atomically, and put back when it was not the one.
 */
function removeIfSame(path: string, ino: number): void {
  const aside = join(dirname(path), `.${basename(path)}.stale-${randomBytes(4).toString('hex')}`);
  try {
    renameSync(path, aside);
  } catch {
    return; // gone already
  }
  try {
    if (statSync(aside).ino !== ino) linkSync(aside, path); // a live claim: back in place (EEXIST: a newer one stands)
  } catch {
    // put back failed: a third claim was linked meanwhile and stands
  } finally {
    rmSync(aside, { force: true });
  }
}

/**
 * Creates `path` with `text` unless it exists (false then), never visible half-written: the text
 * is written to a file of its own and hard-linked as `path` (link(2) fails if `path` exists). A
 * claim created in place (O_EXCL, then write) could be read empty by another claimant between the
 * two, which took that for a stale claim, removed it and claimed the range itself: two edges on
 * one range, seen with pools of namespaces made ahead refilling beside other edges' creates.
 */
function createWhole(path: string, text: string): boolean {
  // A dot name: never read as a claim (uidRangesOf takes numeric names only).
  const tmp = join(dirname(path), `.${basename(path)}.new-${randomBytes(4).toString('hex')}`);
  writeFileSync(tmp, text, { flag: 'wx', mode: 0o600 });
  try {
    linkSync(tmp, path);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    return false;
  } finally {
    rmSync(tmp, { force: true });
  }
}

/** Edge ids this process holds (see the class comment). */
const heldHere = new Set<string>();

export class EdgeIdTakenError extends HostNotReadyError {
  override readonly name = 'EdgeIdTakenError';
}

/**
 * Takes the host-wide lock on an edge id: a second edge with the same id (which would delete the
 * first one's host guard table, reuse its crun root names and cgroups) refuses to start instead.
 * Returns the release function.
 */
export function lockEdgeId(edgeId: string): () => void {
  const path = join(CLAIMS_DIR, 'edges', `${edgeId}.lock`);
  const r = claim(path, edgeId, (c) => !alive(c.pid) || (c.pid === process.pid && !heldHere.has(edgeId)));
  if (!r.ok)
    throw new EdgeIdTakenError(
      `edge id ${edgeId} is already in use on this host (process ${r.holder.pid}); give each edge its own --edge-id (or DSEC_EDGE_ID, which dsec demo reads too), or stop the other one`,
    );
  heldHere.add(edgeId);
  return () => {
    heldHere.delete(edgeId);
    if (readClaim(path)?.pid === process.pid) rmSync(path, { force: true });
  };
}

/**
 * Claims link-local block `block` (a third octet of 169.254.0.0/16) for `edgeId`. A block stays
 * its edge's until that edge gives it back, also across the edge's restarts and crashes: its
 * sandboxes keep their links while the edge is down. Only another boot frees it.
 */
export function claimLinkBlock(block: number, edgeId: string): boolean {
  const path = join(CLAIMS_DIR, 'link-blocks', String(block));
  const r = claim(path, edgeId, (c) => c.owner === edgeId);
  return r.ok;
}

export function releaseLinkBlock(block: number, edgeId: string): void {
  const path = join(CLAIMS_DIR, 'link-blocks', String(block));
  if (readClaim(path)?.owner === edgeId) rmSync(path, { force: true });
}

/**
 * Claims host uid range `slot` (host/uid-ranges.ts) for sandbox `sandboxId` of `edgeId`. Like a
 * link block it stays claimed across the edge's restarts and crashes (the sandbox keeps running
 * as that range) until the edge releases it; only another boot frees it otherwise.
 */
export function claimUidRange(slot: number, edgeId: string, sandboxId: string): boolean {
  return claim(join(CLAIMS_DIR, 'uid-ranges', String(slot)), `${edgeId}/${sandboxId}`, () => false).ok;
}

export function releaseUidRange(slot: number, edgeId: string, sandboxId: string): void {
  const path = join(CLAIMS_DIR, 'uid-ranges', String(slot));
  if (readClaim(path)?.owner === `${edgeId}/${sandboxId}`) rmSync(path, { force: true });
}

/**
 * Hands the claim on range `slot` from `fromId` to `toId` (both of `edgeId`) in one step: the new
 * claim is written beside it and renamed over it, so the claim file never goes missing and no
 * other edge on the host can claim the range in between (a release then a claim would let it).
 * False when the claim is not `fromId`'s.
 */
export function handOverUidRange(slot: number, edgeId: string, fromId: string, toId: string): boolean {
  const path = join(CLAIMS_DIR, 'uid-ranges', String(slot));
  const held = readClaim(path);
  if (held?.owner !== `${edgeId}/${fromId}` || held.boot !== bootId) return false;
  // Not a number: uidRangesOf and claimUidRange never read it as a slot's claim.
  const tmp = join(CLAIMS_DIR, 'uid-ranges', `.${slot}.handover-${randomBytes(4).toString('hex')}`);
  try {
    writeFileSync(tmp, JSON.stringify({ owner: `${edgeId}/${toId}`, pid: process.pid, boot: bootId } satisfies Claim), {
      flag: 'wx',
      mode: 0o600,
    });
    renameSync(tmp, path);
  } finally {
    rmSync(tmp, { force: true });
  }
  return true;
}

/** Whether slot `slot`'s claim (this boot's) is `sandboxId`'s of `edgeId`. */
export function holdsUidRange(slot: number, edgeId: string, sandboxId: string): boolean {
  const c = readClaim(join(CLAIMS_DIR, 'uid-ranges', String(slot)));
  return c?.owner === `${edgeId}/${sandboxId}` && c.boot === bootId;
}

/** The uid range slots this host's claims give to `edgeId`'s sandboxes (this boot's). */
export function uidRangesOf(edgeId: string): { slot: number; sandboxId: string }[] {
  const dir = join(CLAIMS_DIR, 'uid-ranges');
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  const out: { slot: number; sandboxId: string }[] = [];
  for (const name of names) {
    const c = readClaim(join(dir, name));
    if (c && c.boot === bootId && c.owner.startsWith(`${edgeId}/`) && /^\d+$/.test(name))
      out.push({ slot: Number(name), sandboxId: c.owner.slice(edgeId.length + 1) });
  }
  return out;
}
