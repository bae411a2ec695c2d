import { Readable } from 'node:stream';
import type {
  ExecRequest,
  NetworkPolicyRequest,
  OpenSessionRequest,
  ReplayResult,
  SandboxInfo,
  SessionExecRequest,
  StartProcessRequest,
  TrajectoryEntry,
} from '@dsec/sdk/schema';
import { DEFAULT_PROJECT, type CreateSandboxRequest } from '@dsec/sdk/schema';
import type { EdgeApi, EdgeNetworkRequest, FileActor, FileMetadataWrite } from '../../edge/protocol/edge-api.js';
import { ApiError } from '../../api-error.js';
import { checkPolicy } from './sandbox-spec.js';
import type { EndedSandboxes } from '../ended-sandboxes.js';
import type { StateStore } from '../state-store.js';
import type { TrajectoryLog } from '../trajectory-log.js';
import { SYSTEM, type Caller } from './callers.js';
import type { SandboxLookup } from './sandbox-lookup.js';
import type { SandboxService } from './sandboxes.js';

type Step = ReplayResult['steps'][number];

/** Rebuilds sandboxes from their trajectories. */
export class ReplayService {
  constructor(
    private readonly deps: {
      store: StateStore;
      lookup: SandboxLookup;
      sandboxes: SandboxService;
      trajectory: TrajectoryLog;
      ended: EndedSandboxes;
    },
  ) {}

  /**
   * Rebuilds a sandbox from its trajectory: a new sandbox from the original's exact image and
   * spec, the logged steps re-run in order, and the original log copied to the new sandbox, so the
   * trainer reads the results it already consumed from the log and continues from there.
   */
  async replay(caller: Caller, id: string): Promise<ReplayResult> {
    const from = await this.#original(caller, id);
    const { orig, spec } = from;
    // A lost sandbox is rebuilt on another edge: node labels that pinned it to the lost one go.
    if (orig?.status === 'lost' && spec.placement?.labels) {
      const { labels: _pinned, ...placement } = spec.placement;
      spec.placement = placement;
    }
    // Created as dsec itself in the original's project, which the caller was just allowed to see.
    const created = await this.deps.sandboxes
      .create(
        SYSTEM,
        { ...spec, image: from.imageId, labels: { ...(spec.labels ?? {}), 'dsec.replay-of': id } },
        {},
        { project: from.project },
      )
      .catch((err: unknown) => {
        if (err instanceof ApiError && err.code === 'IMAGE_NOT_FOUND' && !from.orig)
          throw new ApiError(
            'IMAGE_NOT_FOUND',
            `sandbox ${id} was killed and its image ${from.imageId} is gone since (deleted or collected): a replay needs that exact image`,
            { id, imageId: from.imageId },
          );
        throw err;
      });
    // The original is replaced: if its edge comes back it must not run beside its replay
    // (reconcile kills a failed row's sandbox; a ready edge is told at once). Only from lost: if
    // its edge came back meanwhile and reconcile kept it, the caller has it again and it stays.
    if (
      orig?.status === 'lost' &&
      (await this.deps.store.sandboxes.setStatusIf(id, 'lost', 'failed', `${orig.reason ?? 'lost'}; replayed as ${created.id}`))
    )
      await Promise.resolve()
        .then(() => this.deps.lookup.edgeOf(orig).killSandbox(id))
        .catch(() => undefined); // its edge is still lost: reconcile kills it when it is back
    let steps;
    try {
      steps = await replayEntries(this.deps.lookup.edgeOf(created), created.id, this.deps.trajectory.replayable(id), {
        policy: checkPolicy,
      });
      await this.deps.trajectory.copy(id, created.id);
    } catch (err) {
      // The replay sandbox exists now: a retry of this call would make a second one.
      if (err instanceof ApiError && err.details['retryable'] === true)
        throw new ApiError(err.code, `${err.message} (replay ${created.id} was created; connect to it or kill it)`, {
          ...err.details,
          retryable: false,
          replay: created.id,
        });
      throw err;
    }
    const ran = steps.filter((s) => !s.skipped);
    return {
      sandbox: created,
      replayed: ran.length,
      diverged: ran.filter((s) => s.diverged).length,
      skipped: steps.length - ran.length,
      steps,
    };
  }

  /**
   * What the replay starts from: a sandbox that still has its row (running, lost, failed…), or one
   * that was killed and whose trajectory is still kept (its tombstone keeps its image and request).
   */
  async #original(
    caller: Caller,
    id: string,
  ): Promise<{ orig: SandboxInfo | undefined; spec: CreateSandboxRequest; imageId: string; project: string }> {
    try {
      const orig = await this.deps.lookup.get(caller, id);
      const spec = (await this.deps.store.sandboxes.spec<CreateSandboxRequest>(id)) ?? {
        image: orig.imageId,
        resources: orig.resources,
        labels: orig.labels,
      };
      return { orig, spec, imageId: orig.imageId, project: orig.project ?? DEFAULT_PROJECT };
    } catch (err) {
      if (!(err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND')) throw err;
      // lookup.get has checked the caller may see this tombstone (else: "no sandbox").
      const killed = err.details['endedAt'] !== undefined ? await this.deps.ended.replaySource(id) : undefined;
      if (!killed) throw err;
      return { orig: undefined, spec: killed.spec, imageId: killed.imageId, project: killed.project };
    }
  }
}

/**
 * Re-runs a logged trajectory, in order, on a fresh sandbox: commands, session commands (in
 * sessions opened anew, mapped from the old ids) and file changes (from their kept payloads).
 * Background processes are started again, and get the logged stdin and signals (ids mapped
 * like sessions'). Network policy switches are applied again (names resolved anew). Each re-run step reports
 * whether it diverged from the log (failed, or a different exit code); steps that cannot be re-run
 * (terminals, payloads too large to keep) or need not be (pause, resume) are reported as skipped,
 * never as diverged. The logged results stay the answer to steps the trainer already consumed.
 */
export async function replayEntries(
  edge: EdgeApi,
  sandboxId: string,
  entries: AsyncIterable<TrajectoryEntry & { payload: Buffer | null }>,
  deps: { policy: (req: NetworkPolicyRequest) => EdgeNetworkRequest },
): Promise<Step[]> {
  const sessions = new Map<string, string>();
  const processes = new Map<string, string>();
  const steps: Step[] = [];
  for await (const e of entries) {
    const step: Step = { seq: e.seq, kind: e.kind, diverged: false, skipped: false };
    if (e.exitCode !== undefined) step.loggedExitCode = e.exitCode;
    const skip = skipReason(e);
    if (skip) {
      steps.push({ ...step, skipped: true, skipReason: skip });
      continue;
    }
    try {
      const r = e.request;
      switch (e.kind) {
        case 'exec': {
          const { stdinBytes: _ignored, ...rest } = r as ExecRequest & { stdinBytes?: number };
          const req: ExecRequest = { ...rest };
          if (e.payload) {
            req.stdin = e.payload.toString('base64');
            req.stdinEncoding = 'base64';
          }
          step.replayedExitCode = (await edge.exec(sandboxId, req)).exitCode;
          break;
        }
        case 'session.open': {
          const info = await edge.openSession(sandboxId, r as OpenSessionRequest);
          sessions.set(String((e.result ?? {})['sessionId']), info.id);
          break;
        }
        case 'session.exec': {
          const { sessionId, ...req } = r as SessionExecRequest & { sessionId: string };
          const sid = sessions.get(sessionId);
          if (!sid) throw new Error(`session ${sessionId} was not opened in the replay`);
          step.replayedExitCode = (await edge.sessionExec(sandboxId, sid, req)).exitCode;
          break;
        }
        case 'session.close': {
          const sid = sessions.get(String(r['sessionId']));
          if (sid) await edge.closeSession(sandboxId, sid);
          break;
        }
        case 'files.write': {
          const metadata = r['metadata'] as FileMetadataWrite | undefined;
          const opts = { ...loggedActor(r), ...(metadata ? { metadata } : {}) };
          await edge.writeFile(sandboxId, String(r['path']), e.payload ?? Buffer.alloc(0), parseInt(String(r['mode'] ?? '644'), 8), opts);
          break;
        }
        case 'files.mkdir':
          await edge.makeDir(sandboxId, String(r['path']), r['parents'] !== false, loggedActor(r));
          break;
        case 'files.remove':
          await edge.removePath(sandboxId, String(r['path']), r['recursive'] === true, loggedActor(r));
          break;
        case 'files.rename':
          await edge.renamePath(sandboxId, String(r['from']), String(r['to']), loggedActor(r));
          break;
        case 'process.start': {
          const info = await edge.startProcess(sandboxId, r as StartProcessRequest);
          processes.set(String((e.result ?? {})['processId']), info.id);
          break;
        }
        case 'process.signal':
        case 'process.stdin': {
          const pid = processes.get(String(r['processId']));
          if (!pid) throw new Error(`process ${String(r['processId'])} was not started in the replay`);
          if (e.kind === 'process.signal') await edge.signalProcess(sandboxId, pid, r['signal'] as NodeJS.Signals);
          else await edge.writeProcessStdin(sandboxId, pid, e.payload ?? Buffer.alloc(0), r['eof'] === true);
          break;
        }
        case 'network.set':
          await edge.setNetwork(sandboxId, deps.policy(r as NetworkPolicyRequest));
          break;
        case 'pty':
        case 'pause':
        case 'resume':
        case 'edge.gap':
        case 'sandbox.migrated':
          break; // skipped above
        case 'files.upload':
          await edge.uploadTar(sandboxId, String(r['path']), Readable.from([e.payload ?? Buffer.alloc(0)]));
          break;
      }
      if (step.loggedExitCode !== undefined && step.replayedExitCode !== step.loggedExitCode) step.diverged = true;
    } catch (err) {
      step.diverged = true;
      step.error = (err as Error).message;
    }
    steps.push(step);
  }
  return steps;
}

/** The user a logged file step acted as (absent: the sandbox's root), for the replay to act as again. */
function loggedActor(r: Record<string, unknown>): { as?: FileActor } {
  return r['as'] ? { as: r['as'] as FileActor } : {};
}

/** Why a logged step is not re-run, or undefined when it is. */
function skipReason(e: TrajectoryEntry): string | undefined {
  if (e.kind === 'pty') return 'interactive terminal sessions are not replayable';
  if (e.kind === 'pause' || e.kind === 'resume') return 'a pause changes no state a replay must redo';
  if (e.kind === 'edge.gap') return "the sandbox's edge was unreachable for a while; nothing was done in it";
  if (e.kind === 'sandbox.migrated') return 'a move to another edge changes no state a replay must redo';
  if (!e.replayable) return 'the step was not kept in full (payload over the log limit)';
  return undefined;
}
