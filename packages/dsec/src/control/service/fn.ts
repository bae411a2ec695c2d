import type { Logger } from 'pino';
import {
  DEFAULT_PROJECT,
  DEFAULT_FN_DISK_MIB,
  DEFAULT_FN_IMAGE,
  DEFAULT_FN_MEMORY_MIB,
  DEFAULT_FN_TIMEOUT_MS,
  DEFAULT_MAX_OUTPUT_BYTES,
  MAX_STDIN_BYTES,
  type CreateSandboxRequest,
  type FnBatchLine,
  type FnBatchRequest,
  type FnRunRequest,
  type FnRunResult,
  type ImageConfig,
} from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { EdgeFnRequest } from '../../edge/protocol/edge-api.js';
import { rejectNul } from '../../edge/protocol/reject-nul.js';
import type { EdgeRegistry } from '../edges/edge-registry.js';
import type { Metrics } from '../metrics.js';
import { place } from '../placement.js';
import { withOutputReserved, type OutputBudget } from '../../output-budget.js';

/** An image name is resolved at most this often per name: a burst of calls reads the image store once. */
const IMAGE_CACHE_MS = 2000;

export interface FnServiceDeps {
  edges: EdgeRegistry;
  /** Image (and stacked layers) → layer digests and config, as creates resolve it. */
  /** `project`: its own images are usable too; undefined: shared images only. */
  compose: (req: CreateSandboxRequest, project: string | undefined) => Promise<{ imageId: string; layers: string[]; config: ImageConfig }>;
  /** Calls are counted per project (dsec_project_fn_calls_total). */
  metrics: Pick<Metrics, 'fnCall'>;
  log: Logger;
  /** A call's result is buffered whole: caps above the default reserve their worst case here. */
  outputBudget: OutputBudget;
}

export interface FnRunOptions {
  /** The caller's project; undefined: the default project. */
  project?: string | undefined;
  signal?: AbortSignal | undefined;
  /** Takes the result's output reservation, to give back once the answer is sent (releaseWhenSent); else it goes back with the result. */
  hold?: ((release: () => void) => void) | undefined;
}

/**
 * Function calls (POST /v1/fn/run, /v1/fn/batch): fills a call's defaults, resolves its image, picks
 * an edge (placement, as for a sandbox of the worker's size) and hands the call to that edge's
 * FnCall backend, which runs it in a warm worker (edge/backends/fncall/). Calls are not sandbox
 * steps: nothing is written to the state store per call.
 */
export class FnService {
  readonly #images = new Map<string, { at: number; value: { imageId: string; layers: string[]; config: ImageConfig } }>();

  constructor(private readonly deps: FnServiceDeps) {}

  /**
   * `project`: the caller's; its calls get workers of their own (a worker never serves two
   * projects) and may use the project's own images.
   */
  async run(call: FnRunRequest, opts: FnRunOptions = {}): Promise<FnRunResult> {
    const project = opts.project ?? DEFAULT_PROJECT;
    try {
      const result = await withOutputReserved(
        this.deps.outputBudget,
        project,
        call.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES,
        () => this.#run(call, opts),
        opts.hold,
      );
      this.deps.metrics.fnCall(project, 'ok');
      return result;
    } catch (err) {
      this.deps.metrics.fnCall(project, err instanceof ApiError ? err.code : 'INTERNAL');
      throw err;
    }
  }

  async #run(call: FnRunRequest, opts: { project?: string | undefined; signal?: AbortSignal | undefined }): Promise<FnRunResult> {
    const { project, signal } = opts;
    const full = withDefaults(call);
    const image = await this.#image(full.image!, project);
    const req: EdgeFnRequest = { call: full, ...image, ...(project !== undefined ? { tenant: project } : {}) };
    const limits = { cpu: 1, memoryMiB: full.memoryMiB!, pids: 256 };
    const exclude = new Set<string>();
    for (;;) {
      const chosen = place(this.deps.edges.candidates(), { limits, layers: image.layers, pool: 'default', labels: undefined, exclude });
      if (!chosen) {
        throw new ApiError(
          'CAPACITY_EXCEEDED',
          `no edge can run this call now (memoryMiB ${full.memoryMiB}); retry, lower memoryMiB, or add nodes`,
          {},
        );
      }
      const api = this.deps.edges.api(chosen.id);
      if (!api.runFn) {
        exclude.add(chosen.id);
        continue;
      }
      try {
        return await api.runFn(req, signal);
      } catch (err) {
        const retry =
          err instanceof ApiError &&
          (err.code === 'CAPACITY_EXCEEDED' ||
            err.code === 'BACKEND_UNSUPPORTED' ||
            (err.code === 'EDGE_UNAVAILABLE' && err.details['retryable'] === true));
        if (!retry) throw err;
        exclude.add(chosen.id);
      }
    }
  }

  /**
   * Runs a batch's calls `concurrency` at a time and yields one line per call as it finishes
   * (a failed call is a line with its error, not the end of the batch). Stopping the iteration
   * (the client went away) starts no more calls.
   */
  async *batch(
    req: FnBatchRequest,
    opts: { project?: string | undefined; signal?: AbortSignal | undefined } = {},
  ): AsyncGenerator<FnBatchLine> {
    // Every call is checked before the first runs: a bad one is one 400, not a stream of failures.
    for (const [i, c] of req.calls.entries()) {
      try {
        await this.#image(withDefaults(c).image!, opts.project);
      } catch (err) {
        if (err instanceof ApiError) err.details['index'] = i;
        throw err;
      }
    }
    // Each waiting line keeps its call's output reservation until the reader has taken it.
    const ready: { line: FnBatchLine; release: () => void }[] = [];
    let wake: (() => void) | undefined;
    let next = 0;
    let running = 0;
    let stopped = false;
    // Results waiting to be sent count against the concurrency with the calls running: a client that
    // stops reading stops the batch's calls, rather than results piling up here (each up to its cap).
    const start = (): void => {
      while (!stopped && running + ready.length < (req.concurrency ?? 32) && next < req.calls.length) {
        const index = next++;
        running++;
        let release: () => void = () => {};
        void this.run(req.calls[index]!, { ...opts, hold: (r) => (release = r) })
          .then(
            (result) => ready.push({ line: { index, result }, release }),
            (err: unknown) => {
              const e = err instanceof ApiError ? err : new ApiError('INTERNAL', (err as Error).message);
              ready.push({ line: { index, error: { code: e.code, message: e.message } }, release });
            },
          )
          .finally(() => {
            running--;
            if (stopped) for (const r of ready.splice(0)) r.release();
            start();
            wake?.();
          });
      }
    };
    try {
      start();
      let sent = 0;
      while (sent < req.calls.length) {
        const taken = ready.shift();
        if (taken) {
          sent++;
          start(); // its room goes to the next call
          try {
            yield taken.line;
          } finally {
            taken.release(); // the reader asked for the next line (or left): this one is theirs
          }
          continue;
        }
        await new Promise<void>((r) => (wake = r));
        wake = undefined;
      }
    } finally {
      stopped = true;
      for (const r of ready.splice(0)) r.release();
    }
  }

  async #image(name: string, project: string | undefined): Promise<{ imageId: string; layers: string[]; config: ImageConfig }> {
    const cacheKey = JSON.stringify([project ?? null, name]);
    const hit = this.#images.get(cacheKey);
    if (hit && Date.now() - hit.at < IMAGE_CACHE_MS) return hit.value;
    let value: { imageId: string; layers: string[]; config: ImageConfig };
    try {
      value = await this.deps.compose({ image: name }, project);
    } catch (err) {
      if (err instanceof ApiError && err.code === 'IMAGE_NOT_FOUND' && name === DEFAULT_FN_IMAGE) {
        err.message = `no image ${DEFAULT_FN_IMAGE}, the default of fn calls: build it with \`dsec image build fn-runtime\` (python3, node and bash from this host) or name an image with python3 in it (image)`;
      }
      throw err;
    }
    this.#images.set(cacheKey, { at: Date.now(), value });
    return value;
  }
}

/** A call with every default filled, checked for what the schema cannot say. */
export function withDefaults(call: FnRunRequest): FnRunRequest {
  rejectNul('args', call.args ?? []);
  rejectNul('env', Object.entries(call.env ?? {}).flat());
  if (call.stdin !== undefined && Buffer.byteLength(call.stdin, call.stdinEncoding ?? 'utf8') > MAX_STDIN_BYTES) {
    throw new ApiError('PAYLOAD_TOO_LARGE', `stdin is over ${MAX_STDIN_BYTES} bytes; pass large input as files`, {
      field: 'stdin',
      limit: MAX_STDIN_BYTES,
    });
  }
  for (const path of Object.keys(call.files ?? {})) {
    if (path.startsWith('/') || path.split('/').includes('..') || path.includes('\0')) {
      throw new ApiError(
        'INVALID_REQUEST',
        `files: ${JSON.stringify(path)} must be a relative path inside the call's scratch dir (no /, no ..)`,
        { field: 'files' },
      );
    }
  }
  return {
    ...call,
    timeoutMs: call.timeoutMs ?? DEFAULT_FN_TIMEOUT_MS,
    memoryMiB: call.memoryMiB ?? DEFAULT_FN_MEMORY_MIB,
    diskMiB: call.diskMiB ?? DEFAULT_FN_DISK_MIB,
    network: call.network ?? false,
    image: call.image ?? DEFAULT_FN_IMAGE,
    maxOutputBytes: call.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES,
    encoding: call.encoding ?? 'utf8',
  };
}
