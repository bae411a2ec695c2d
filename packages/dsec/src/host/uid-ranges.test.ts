import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { CLAIMS_DIR, uidRangesOf } from './host-claims.js';
import { FIRST_UID_BASE, OVERFLOW_ID, type RangeClaims, UID_RANGE_SIZE, UidRangePool, rangeOfSlot, toSandboxId } from './uid-ranges.js';

/** Claims in memory, shared by the pools given it (as the host's files are shared by edges). */
function memoryClaims(): RangeClaims & { owners: Map<number, string> } {
  const owners = new Map<number, string>();
  return {
    owners,
    claim: (slot, edge, sb) => (owners.has(slot) ? false : (owners.set(slot, `${edge}/${sb}`), true)),
    release: (slot, edge, sb) => void (owners.get(slot) === `${edge}/${sb}` && owners.delete(slot)),
    handOver: (slot, edge, from, to) => (owners.get(slot) === `${edge}/${from}` ? (owners.set(slot, `${edge}/${to}`), true) : false),
    holds: (slot, edge, sb) => owners.get(slot) === `${edge}/${sb}`,
    held: (edge) =>
      [...owners].filter(([, o]) => o.startsWith(`${edge}/`)).map(([slot, o]) => ({ slot, sandboxId: o.slice(edge.length + 1) })),
  };
}

describe('uid ranges', () => {
  test('a range maps its base to in-sandbox 0 and nothing else inside', () => {
    const r = rangeOfSlot(3);
    assert.equal(r.base, FIRST_UID_BASE + 3 * UID_RANGE_SIZE);
    assert.equal(toSandboxId(r, r.base), 0);
    assert.equal(toSandboxId(r, r.base + 1000), 1000);
    assert.equal(toSandboxId(r, 0), OVERFLOW_ID, 'host root is nobody inside');
    assert.equal(toSandboxId(r, r.base + UID_RANGE_SIZE), OVERFLOW_ID, 'the next range is nobody inside');
  });

  test('two edges on one host get disjoint ranges; a released range is reused', () => {
    const claims = memoryClaims();
    const a = new UidRangePool('ea', claims);
    const b = new UidRangePool('eb', claims);
    const ra = [a.take('s1'), a.take('s2')];
    const rb = [b.take('s3'), a.take('s4')];
    const all = [...ra, ...rb];
    for (const x of all)
      for (const y of all)
        if (x !== y) assert.ok(x.base + x.size <= y.base || y.base + y.size <= x.base, `ranges overlap: ${x.base} ${y.base}`);
    a.release('s2');
    assert.equal(claims.owners.has(ra[1]!.slot), false, 'the claim goes with its sandbox');
    assert.equal(b.take('s5').slot, ra[1]!.slot, 'the lowest free range is taken again');
  });

  test('after a restart: adopted ranges stay, claims of dead sandboxes are given back', () => {
    const claims = memoryClaims();
    const before = new UidRangePool('ea', claims);
    const live = before.take('alive');
    const dead = before.take('dead');
    const after = new UidRangePool('ea', claims);
    assert.equal(after.adopt('alive', live), true);
    assert.equal(
      after.reconcile((id) => id === 'alive'),
      1,
    );
    assert.equal(claims.owners.has(dead.slot), false);
    assert.equal(claims.owners.get(live.slot), 'ea/alive');
    assert.deepEqual(after.slots(), [live.slot]);
  });

  test("adopting a sandbox reads its own claim, not all of the host's (a restart beside thousands stays linear)", () => {
    const claims = memoryClaims();
    let fullReads = 0;
    const counted: RangeClaims = { ...claims, held: (edge) => (fullReads++, claims.held(edge)) };
    const before = new UidRangePool('ea', claims);
    const ranges = Array.from({ length: 200 }, (_, i) => before.take(`s${i}`));
    const after = new UidRangePool('ea', counted);
    ranges.forEach((r, i) => assert.equal(after.adopt(`s${i}`, r), true));
    assert.equal(fullReads, 0, 'each adopt listed every claim on the host');
    assert.equal(after.adopt('other', rangeOfSlot(ranges[0]!.slot)), false, "another sandbox's range is not adopted");
  });

  test('a range held for a namespace made ahead is handed over to a sandbox: never free in between, released with the sandbox', () => {
    const claims = memoryClaims();
    const a = new UidRangePool('ea', claims);
    const b = new UidRangePool('eb', claims);
    const pooled = a.take('userns-pool.1');
    assert.equal(a.handOver(pooled.slot, 'userns-pool.1', 'sb1'), true);
    assert.equal(claims.owners.get(pooled.slot), 'ea/sb1');
    assert.equal(a.handOver(pooled.slot, 'userns-pool.1', 'sb2'), false, 'a range is handed over once');
    assert.notEqual(b.take('s2').slot, pooled.slot);
    a.release('sb1');
    assert.equal(claims.owners.has(pooled.slot), false);
    assert.equal(a.handOver(pooled.slot, 'sb1', 'sb3'), false, 'a released range cannot be handed over');
  });

  test(
    'host-wide hand-over: the claim file is replaced in one rename and names the sandbox; another edge cannot claim it',
    { skip: process.getuid?.() === 0 ? undefined : 'the claims dir needs root' },
    () => {
      const edgeA = `ut${process.pid}h`;
      const edgeB = `ut${process.pid}i`;
      const a = new UidRangePool(edgeA);
      const b = new UidRangePool(edgeB);
      const r = a.take('userns-pool.1');
      const file = join(CLAIMS_DIR, 'uid-ranges', String(r.slot));
      try {
        assert.equal(a.handOver(r.slot, 'userns-pool.1', 'sb1'), true);
        assert.match(readFileSync(file, 'utf8'), new RegExp(`"owner":"${edgeA}/sb1"`));
        assert.deepEqual(uidRangesOf(edgeA), [{ slot: r.slot, sandboxId: 'sb1' }], 'no hand-over file is read as a claim');
        const other = b.take('y');
        assert.notEqual(other.slot, r.slot);
        b.release('y');
      } finally {
        a.release('sb1');
      }
      assert.ok(!existsSync(file) || !readFileSync(file, 'utf8').includes(`"${edgeA}/`), 'the claim outlived its release');
    },
  );

  test(
    'host-wide claims: two edges never hold one slot, and a release removes the claim file',
    { skip: process.getuid?.() === 0 ? undefined : 'the claims dir needs root' },
    () => {
      const edgeA = `ut${process.pid}a`;
      const edgeB = `ut${process.pid}b`;
      const a = new UidRangePool(edgeA);
      const b = new UidRangePool(edgeB);
      const ra = a.take('x');
      const rb = b.take('y');
      try {
        assert.notEqual(ra.slot, rb.slot);
        assert.ok(existsSync(join(CLAIMS_DIR, 'uid-ranges', String(ra.slot))));
      } finally {
        a.release('x');
        b.release('y');
      }
      // Another edge on the host may have claimed the slot since: it is just no longer this one's.
      const file = join(CLAIMS_DIR, 'uid-ranges', String(ra.slot));
      assert.ok(!existsSync(file) || !readFileSync(file, 'utf8').includes(`"${edgeA}/x"`), 'the claim file outlived its release');
      assert.deepEqual(a.slots(), []);
    },
  );
});
