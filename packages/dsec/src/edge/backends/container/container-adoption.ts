import { existsSync, readFileSync, rmSync } from 'node:fs';
import { thaw } from '../../../host/freezer.js';
import type { Logger } from 'pino';
import { CGROUP_PARENT, cgroupPids, killCgroupProcesses, listSandboxCgroups, removeCgroupTreeSettled } from '../../../host/cgroups.js';
import type { UidRangePool } from '../../../host/uid-ranges.js';
import type { LayerDigest } from '../../../image/layer-store.js';
import type { Crun } from './crun.js';
import { refreshLandlockBinary } from './helper-binds.js';
import { endExecsOfOldEdge, newLiveSandbox, type LiveSandbox } from './live-sandbox.js';
import { LANDLOCK_PATH } from './oci-config.js';
import type { SandboxRecords } from './sandbox-record.js';

/** What adoption at start uses of the container backend. */
export interface AdoptionContext {
  records: SandboxRecords;
  crun: Crun;
  uidRanges: UidRangePool;
  /** The backend's running sandboxes: adopted ones go in. */
  live: Map<string, LiveSandbox>;
  /** Removes everything of a dead sandbox (its layers are not released: no mount holds them yet). */
  teardown(id: string, layers: LayerDigest[]): Promise<void>;
  log: Logger;
}

/**
 * At start: every sandbox dir is adopted (its container still runs, its layers are readable) or
 * cleaned up, then the containers and cgroups nothing on disk accounts for are removed.
 * `running`: crun's containers by id; `lazyDead`: the lazy layers no daemon serves any more.
 */
export async function adoptOrClean(
  ctx: AdoptionContext,
  running: Map<string, { pid: number; status: string }>,
  lazyDead: Set<LayerDigest>,
): Promise<{ adopted: string[]; cleaned: string[]; failed: { id: string; reason: string }[] }> {
  const adopted: string[] = [];
  const cleaned: string[] = [];
  const failed: { id: string; reason: string }[] = [];
  for (const { id, record } of ctx.records.scan()) {
    const c = running.get(id);
    running.delete(id);
    const lostLayer = record?.layers.find((l) => lazyDead.has(l));
    if (lostLayer && record?.phase === 'running') {
      failed.push({ id, reason: `its layer ${lostLayer} was served by a lazy layer daemon that died while the edge was down` });
    }
    // A paused sandbox is adopted too (crun reports its frozen cgroup as paused): the kernel's
    // freezer, not state.json, says whether it is paused.
    if (record?.phase === 'running' && !lostLayer && (c?.status === 'running' || c?.status === 'paused')) {
      const marker = ctx.records.paths(id, record).held;
      let paused = c.status === 'paused';
      if (paused && existsSync(marker)) {
        // Frozen by the edge for a move or a snapshot that did not finish (the edge went down
        // meanwhile): it runs on here, as its control plane has it. A thaw that fails leaves this
        // one sandbox paused (a resume retries it), not the edge down with every other sandbox.
        try {
          await thaw(id);
          paused = false;
          ctx.log.warn({ sandbox: id }, 'thawed a sandbox held still for a move or a snapshot that did not finish');
        } catch (err) {
          ctx.log.error({ sandbox: id, err: (err as Error).message }, 'could not thaw a sandbox held still by the edge; adopted paused');
        }
      }
      rmSync(marker, { force: true });
      const live = newLiveSandbox({ ...record, pid: c.pid, paused }, ctx.records, ctx.crun);
      ctx.live.set(id, live);
      await endExecsOfOldEdge(live);
      await refreshHelpers(ctx, live, c.pid);
      if (record.userns && !ctx.uidRanges.adopt(id, record.userns)) {
        ctx.log.error({ sandbox: id, range: record.userns }, "another sandbox on this host claims this sandbox's uid range");
      }
      adopted.push(id);
      continue;
    }
    // A sandbox's leftovers are its own to shape; failing to clean one must not keep the edge
    // (and every other sandbox) down. It stays for the next start or an operator, logged.
    try {
      await ctx.teardown(id, record?.layers ?? []);
      cleaned.push(id);
    } catch (err) {
      ctx.log.error({ sandbox: id, err: (err as Error).message }, 'could not clean up a dead sandbox; leaving it and starting anyway');
    }
  }
  // Containers in our crun root without a sandbox dir: a crash between crun run and state save.
  for (const id of running.keys()) {
    await ctx.crun.delete(id);
    await removeCgroupTreeSettled(`${CGROUP_PARENT}/${id}`);
    cleaned.push(id);
  }
  // Cgroups of sandboxes that nothing above accounted for (crun state lost), recognised as this
  // edge's by their processes' root being under this edge's directory.
  for (const cg of listSandboxCgroups()) {
    if (!ctx.live.has(cg) && cgroupPids(`${CGROUP_PARENT}/${cg}`).some((pid) => rootOf(pid).startsWith(ctx.records.dir + '/'))) {
      await killCgroupProcesses(`${CGROUP_PARENT}/${cg}`);
      await removeCgroupTreeSettled(`${CGROUP_PARENT}/${cg}`);
      cleaned.push(cg);
    }
  }
  return { adopted, cleaned, failed };
}

/**
 * An adopted sandbox made by an older build keeps that build's dsec-landlock (helper-binds.ts):
 * the current one is bound over it. When that fails, its commands fail with the reason
 * (ExecTarget.unusable) rather than with the old binary's usage error, and it is logged here.
 */
export async function refreshHelpers(ctx: AdoptionContext, live: LiveSandbox, pid: number): Promise<void> {
  try {
    if (await refreshLandlockBinary(pid, ctx.crun.spawner)) {
      ctx.log.info({ sandbox: live.record.id }, "sandbox from an older dsec: its dsec-landlock was replaced with this build's");
    }
  } catch (err) {
    const why = (err as Error).message;
    live.target.unusable = `sandbox ${live.record.id} was made by an older dsec and its command starter (${LANDLOCK_PATH}) could not be replaced with this build's (${why}), so commands cannot run in it: recreate it`;
    ctx.log.error(
      { sandbox: live.record.id, err: why },
      "could not replace an adopted sandbox's dsec-landlock with this build's; its commands will fail until it is recreated",
    );
  }
}

/**
 * The overlay upper dir of a process's root filesystem ('' when unreadable). /proc/<pid>/root
 * reads as "/" for a process in another mount namespace, but its mountinfo names the upper dir.
 */
function rootOf(pid: number): string {
  try {
    const line = readFileSync(`/proc/${pid}/mountinfo`, 'utf8')
      .split('\n')
      .find((l) => l.split(' ')[4] === '/');
    return /upperdir=([^,\s]+)/.exec(line ?? '')?.[1] ?? '';
  } catch {
    return '';
  }
}
