import { constants as os } from 'node:os';
import { MAX_PATH_BYTES, type DiffLimits, type DiffStats } from '../../../image/pack-diff.js';
import { extractTarSafely } from '../../../image/oci/safe-extract.js';
import { AgentError, type AgentClient } from './agent-client.js';
import type { AgentFrame } from './agent-frames.js';

/**
 * Bytes of the guest's archive in flight at once: the agent sends at most this much before the
 * edge grants more (`credit`), as the extraction takes it. Edge memory per snapshot stays below
 * this plus one pipe's worth (64 KiB) whatever the guest's disk holds.
 */
export const DIFF_WINDOW_BYTES = 1 << 20;

/** The guest's diff ended badly: its own message (stderr, exit code), or the channel closed. */
export class GuestDiffError extends Error {
  override readonly name = 'GuestDiffError';
}

export interface GuestDiffOptions {
  /** Paths (inside the guest) left out, as pack_diff's scrub. */
  scrub: string[];
  limits: DiffLimits;
  /** Stops the guest's reader (killed: its disk thaws) and the extraction. */
  signal: AbortSignal;
  /** The guest kills its reader after this long even if the edge is gone (the disk must thaw). */
  timeoutMs: number;
  warn: (message: string) => void;
}

/**
 * pack_diff for a VM: the guest agent's `diff` streams a tar of the overlay upper (its disk
 * frozen meanwhile, OCI whiteouts; see native/vm-agent.c), and the edge writes it into `stage` as
 * a layer tree with the untrusted-tar reader containers' image imports use (image/oci/): no path
 * leaves `stage`, nothing is followed, whiteouts and opaque directories in overlay form, only
 * user.* and security.capability xattrs. Bounded as a container's snapshot (entries, bytes, path
 * length; the caller bounds the time through `signal`). The host never mounts what the guest wrote.
 */
export async function stageGuestUpper(agent: AgentClient, stage: string, opts: GuestDiffOptions): Promise<DiffStats> {
  const queue: Buffer[] = [];
  let stderr = '';
  /** The agent answered the diff with an error: no reader runs in the guest. */
  let refused = false;
  let exit: { code: number } | undefined;
  let failure: Error | undefined;
  let wake: (() => void) | undefined;
  const onEvent = (f: AgentFrame): void => {
    const ev = f.header['ev'];
    if (ev === 'stdout') queue.push(f.payload);
    else if (ev === 'stderr') stderr = (stderr + f.payload.toString('utf8')).slice(-2000);
    else if (ev === 'exit') exit = { code: Number(f.header['code']) };
    else if (ev === 'error') {
      refused = true;
      failure = new AgentError(String(f.header['code'] ?? 'EIO'), String(f.header['message'] ?? 'diff failed'));
    } else if (ev === 'closed')
      failure = new GuestDiffError(`the VM's agent channel closed during the snapshot: ${String(f.header['message'] ?? '')}`);
    wake?.();
  };
  const id = agent.send('diff', { scrub: opts.scrub, window: DIFF_WINDOW_BYTES, timeoutMs: opts.timeoutMs }, undefined, onEvent);
  const onAbort = (): void => {
    failure ??= opts.signal.reason instanceof Error ? opts.signal.reason : new Error('snapshot cancelled');
    wake?.();
  };
  opts.signal.addEventListener('abort', onAbort, { once: true });
  async function* archive(): AsyncGenerator<Buffer> {
    for (;;) {
      if (failure) throw failure;
      const chunk = queue.shift();
      if (chunk) {
        // Granted back as the reader takes it: the window bounds what waits here.
        agent.write({ op: 'credit', id, bytes: chunk.length });
        yield chunk;
        continue;
      }
      if (exit) {
        if (exit.code !== 0)
          throw new GuestDiffError(`the guest could not read its disk (exit ${exit.code}): ${stderr.trim() || 'no message'}`);
        return;
      }
      await new Promise<void>((r) => (wake = r));
      wake = undefined;
    }
  }
  try {
    if (opts.signal.aborted) onAbort();
    const stats = await extractTarSafely(archive(), stage, {
      layer: true,
      label: 'the guest disk diff',
      warn: opts.warn,
      limits: { ...opts.limits, maxPathBytes: MAX_PATH_BYTES },
    });
    // Whiteouts are entries, as pack_diff counts them: a guest that only deleted files has a layer.
    return {
      entries: stats.entries + stats.whiteouts,
      bytes: stats.bytes,
      whiteouts: stats.whiteouts,
      opaqueDirs: stats.opaqueDirs,
      sparseFiles: 0,
    };
  } finally {
    opts.signal.removeEventListener('abort', onAbort);
    // Stopped early (a bound, a cancel, a bad archive), perhaps before the guest said it started:
    // the agent handles frames in order, so the kill reaches the reader; its exit (the disk
    // thawed) is awaited, so the VM's files are writable again when this returns.
    if (!exit && !refused && !agent.closed) {
      agent.write({ op: 'signal', id, signal: os.signals.SIGKILL });
      for (let i = 0; i < 300 && !exit && !refused && !agent.closed; i++) await new Promise<void>((r) => ((wake = r), setTimeout(r, 100)));
    }
    agent.release(id);
  }
}
