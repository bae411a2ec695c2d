/**
 * What a kill -9 may leave half-made on an edge's node: the node's sandbox directories, crun
 * containers, memory cgroups, rootfs mounts and user-namespace claims, compared with the
 * sandboxes the API says run. The crash-point, create-crash and kill -9 soak tests check it after
 * each restart.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { readMounts } from '../../src/host/mounts.js';
import { uidRangesOf } from '../../src/host/host-claims.js';

/** The node's view of half-made things, compared with the sandboxes the API says run. */
export function halfMade(dataDir: string, edgeId: string, live: Set<string>): Record<string, string[]> {
  const sandboxesDir = join(dataDir, 'node', 'sandboxes');
  const dirs = existsSync(sandboxesDir) ? readdirSync(sandboxesDir) : [];
  const crun = spawnSync('crun', ['--root', join(dataDir, 'node', 'crun'), 'list', '--format', 'json'], { encoding: 'utf8' });
  const containers = ((JSON.parse(crun.stdout || '[]') as { id: string }[] | null) ?? []).map((c) => c.id);
  const cgroups = existsSync('/sys/fs/cgroup/memory/dsec')
    ? readdirSync('/sys/fs/cgroup/memory/dsec').filter((n) => n.startsWith(`sb-${edgeId}-`))
    : [];
  const rootfs = readMounts()
    .map((m) => m.mountPoint)
    .filter((mp) => mp.startsWith(`${sandboxesDir}/`))
    .map((mp) => mp.slice(sandboxesDir.length + 1).split('/')[0]!);
  // User namespaces made ahead (edge/userns-pool.ts): every claim of the edge is a running
  // sandbox's or a pooled namespace's whose file is in the pool's dir (named after its holder:
  // made before the claim, so one being made counts too), and every namespace bound there is a
  // pool holder's that holds its claim. Claims are read first.
  const poolDir = join(dataDir, 'node', 'userns-pool');
  const claims = uidRangesOf(edgeId);
  const poolFiles = existsSync(poolDir) ? readdirSync(poolDir) : [];
  const poolBinds = readMounts()
    .map((m) => m.mountPoint)
    .filter((mp) => mp.startsWith(`${poolDir}/`))
    .map((mp) => mp.slice(poolDir.length + 1));
  const strayClaims = claims.filter(
    (c) => !live.has(c.sandboxId) && !(c.sandboxId.startsWith('userns-pool.') && poolFiles.includes(c.sandboxId)),
  );
  const strayBinds = poolBinds.filter((holder) => !uidRangesOf(edgeId).some((c) => c.sandboxId === holder));
  const out: Record<string, string[]> = {};
  if (strayClaims.length)
    out['uid range claims of no running sandbox or pooled namespace'] = strayClaims.map((c) => `${c.slot}:${c.sandboxId}`);
  if (strayBinds.length) out['pooled namespaces bound without a claim'] = strayBinds;
  for (const [k, ids] of Object.entries({ dirs, containers, cgroups, rootfs })) {
    const extra = [...new Set(ids)].filter((id) => !live.has(id));
    const missing = [...live].filter((id) => !ids.includes(id));
    if (extra.length) out[`${k} of no running sandbox`] = extra;
    if (missing.length) out[`${k} missing for a running sandbox`] = missing;
  }
  return out;
}
