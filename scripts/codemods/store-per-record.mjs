// Rewrites calls of the flat StateStore API (`store.getSandbox(id)`) to the per-record stores
// (`store.sandboxes.get(id)`; issue 28), in the TypeScript files given, in place, then prints every
// call of an old method name it left. Re-runnable: a rewritten call no longer matches. Usage:
//   node scripts/codemods/store-per-record.mjs [--dry-run] [--all] [--receiver NAME]... FILE|DIR...
// A directory is walked for .ts files (node_modules and dist skipped). Run prettier on what it
// changed afterwards (a call it rewrites may now fit on one line). Exit status 1: a store call left.
//
// A receiver is taken for a StateStore when its last property or identifier is `store`,
// `#store` or `store` followed by a capital or digit (`store`, `this.store`, `deps.store`,
// `this.#store`, `s.store`, `storeA`, `store?`, `store!`), with any white space (a line break)
// before the dot. `--receiver a` adds another name (a test's `a` and `b` stores). What it leaves
// is listed as `path:line: text` in two groups: calls on a receiver it took for a store but could
// not rewrite (none expected), and calls of an old name on any other receiver, to check by hand.
// Old names that other classes also have (EdgeApi's listSandboxes, ControlPlane's setExpiry, …)
// are listed only with --all.
import { readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** Old StateStore method → [record store, its method there]. */
const RENAMES = {
  // projects
  insertProject: ['projects', 'insert'],
  getProject: ['projects', 'get'],
  listProjects: ['projects', 'list'],
  setProjectQuota: ['projects', 'setQuota'],
  projectUsage: ['projects', 'usage'],
  // image owners
  imageOwners: ['imageOwners', 'projects'],
  addImageOwner: ['imageOwners', 'add'],
  removeImageOwner: ['imageOwners', 'remove'],
  removeImageOwners: ['imageOwners', 'removeAll'],
  imageNameOwner: ['imageOwners', 'nameOwner'],
  setImageNameOwner: ['imageOwners', 'setNameOwner'],
  removeImageNameOwner: ['imageOwners', 'removeNameOwner'],
  // batches
  insertBatch: ['batches', 'insert'],
  getBatch: ['batches', 'get'],
  listBatches: ['batches', 'list'],
  finishBatch: ['batches', 'finish'],
  appendBatchEvents: ['batches', 'appendEvents'],
  batchEvents: ['batches', 'events'],
  batchSandboxes: ['batches', 'sandboxes'],
  renewBatches: ['batches', 'renew'],
  claimBatches: ['batches', 'claim'],
  requestBatchCancel: ['batches', 'requestCancel'],
  // pools
  insertPool: ['pools', 'insert'],
  listPools: ['pools', 'list'],
  deletePool: ['pools', 'delete'],
  claimPoolSandbox: ['pools', 'claimSandbox'],
  // edges
  upsertEdge: ['edges', 'upsert'],
  listEdges: ['edges', 'list'],
  deleteEdge: ['edges', 'delete'],
  markEdgeLost: ['edges', 'markLost'],
  touchEdge: ['edges', 'touch'],
  // leases and shared settings
  lease: ['leases', 'acquire'],
  releaseLease: ['leases', 'release'],
  sharedSetting: ['leases', 'sharedSetting'],
  // API keys
  countKeys: ['keys', 'count'],
  insertKey: ['keys', 'insert'],
  keyByHash: ['keys', 'byHash'],
  listKeys: ['keys', 'list'],
  revokeKey: ['keys', 'revoke'],
  // sandboxes, their specs, expiry and create leases
  insertSandbox: ['sandboxes', 'insert'],
  insertSandboxes: ['sandboxes', 'insertMany'],
  getSandbox: ['sandboxes', 'get'],
  listSandboxes: ['sandboxes', 'list'],
  deleteSandbox: ['sandboxes', 'delete'],
  sandboxProject: ['sandboxes', 'projectOf'],
  setStatus: ['sandboxes', 'setStatus'],
  setStatuses: ['sandboxes', 'setStatuses'],
  touch: ['sandboxes', 'touch'],
  setExpiry: ['sandboxes', 'setExpiry'],
  expired: ['sandboxes', 'expired'],
  saveSpec: ['sandboxes', 'saveSpec'],
  getSpec: ['sandboxes', 'spec'],
  renewCreates: ['sandboxes', 'renewCreates'],
  createOwner: ['sandboxes', 'createOwner'],
  leasedCreates: ['sandboxes', 'leasedCreates'],
  abandonedCreates: ['sandboxes', 'abandonedCreates'],
  settleCreate: ['sandboxes', 'settleCreate'],
  // volumes
  insertVolume: ['volumes', 'insert'],
  getVolume: ['volumes', 'get'],
  listVolumes: ['volumes', 'list'],
  deleteVolume: ['volumes', 'delete'],
  volumeUsers: ['volumes', 'users'],
};

/** Old names other classes in the tree have too: a call on another receiver is no sign of a miss. */
const SHARED_NAMES = new Set(['lease', 'touch', 'expired', 'listSandboxes', 'deleteVolume', 'setExpiry']);

const args = process.argv.slice(2);
const dryRun = args.includes('--dry-run');
const listAll = args.includes('--all');
const extraReceivers = [];
const targets = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--receiver') extraReceivers.push(args[++i]);
  else if (!args[i].startsWith('--')) targets.push(args[i]);
}
if (targets.length === 0) {
  console.error('usage: node scripts/codemods/store-per-record.mjs [--dry-run] [--all] [--receiver NAME]... FILE|DIR...');
  process.exit(2);
}

const names = Object.keys(RENAMES).join('|');
const RECORDS = new Set(Object.values(RENAMES).map(([record]) => record));
const escape = (s) => s.replace(/[$#]/g, '\\$&');
const receiver = ['#?store(?:[A-Z0-9][\\w$]*)?', ...extraReceivers.map(escape)].join('|');
// The receiver's last segment must start where an identifier can (after `.`, space, `(`, …), so
// `blobStore.touch(` and `restore.touch(` are not taken.
const CALL = new RegExp(`(?<![\\w$#])(${receiver})([!?]?)(\\s*)\\.(${names})(<[^()\\n]*>)?\\(`, 'g');
const OLD_CALL = new RegExp(`([\\w$#\\])!?]*)\\s*\\.(${names})(?:<[^()\\n]*>)?\\(`, 'g');

function* files(path) {
  if (statSync(path).isDirectory()) {
    for (const entry of readdirSync(path)) {
      if (entry === 'node_modules' || entry === 'dist' || entry.startsWith('.')) continue;
      yield* files(join(path, entry));
    }
  } else if (/\.(ts|mts|cts|tsx)$/.test(path) && !path.endsWith('.d.ts')) yield path;
}

let rewritten = 0;
const missed = [];
const others = [];
for (const target of targets) {
  for (const file of files(target)) {
    const text = readFileSync(file, 'utf8');
    let n = 0;
    const out = text.replace(CALL, (_m, recv, mark, space, old, typeArgs = '') => {
      n++;
      const [record, method] = RENAMES[old];
      return `${recv}${mark}${space}.${record}.${method}${typeArgs}(`;
    });
    if (n > 0) {
      rewritten += n;
      console.log(`${file}: ${n} call${n === 1 ? '' : 's'} rewritten`);
      if (!dryRun) writeFileSync(file, out);
    }
    // What is left: calls of an old name (the receiver may end a line above the call).
    const lines = out.split('\n');
    for (const m of out.matchAll(OLD_CALL)) {
      const [, recv, old] = m;
      // A per-record store's method of the same name (`store.sandboxes.setStatus(`) is the new API.
      if (RECORDS.has(recv)) continue;
      const i = out.slice(0, m.index + m[0].length).split('\n').length - 1;
      const line = lines[i];
      const where = `${file}:${i + 1}: ${line.trim()}`;
      const storeLike = new RegExp(`^(${receiver})[!?]?$`).test(recv) || (recv.endsWith(')') && /\bStateStore\b/.test(line));
      if (storeLike) missed.push(where);
      else if (listAll || !SHARED_NAMES.has(old)) others.push(where);
    }
  }
}

console.log(`${rewritten} call${rewritten === 1 ? '' : 's'} rewritten${dryRun ? ' (dry run: nothing written)' : ''}`);
if (missed.length) {
  console.log(`\nold StateStore calls left on a store receiver (rewrite by hand):`);
  for (const m of missed) console.log(`  ${m}`);
}
if (others.length) {
  console.log(`\nold method names on other receivers (a StateStore under another name? check; --all lists the shared names too):`);
  for (const o of others) console.log(`  ${o}`);
}
process.exitCode = missed.length ? 1 : 0;
