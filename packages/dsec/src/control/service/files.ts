import { Readable } from 'node:stream';
import type { FileStat } from '@dsec/sdk/schema';
import type { FileActor, FileMetadataWrite } from '../../edge/protocol/edge-api.js';
import { MAX_PAYLOAD, type TrajectoryLog } from '../trajectory-log.js';
import type { Caller } from './callers.js';
import type { SandboxLookup } from './sandbox-lookup.js';
import { holdAnswer, type Hold, type OutputBudget } from '../../output-budget.js';

/**
 * A running sandbox's files. Writes are written to the trajectory (with their bytes, up to
 * MAX_PAYLOAD, and whom they acted as) so a replay makes them again; reads are not.
 *
 * Each call acts as the sandbox's root unless `opts.as` names one of its users (by the sandbox's
 * own ids): the edge then has the kernel decide each access as for that user
 * (FILE_PERMISSION_DENIED, 403, when it refuses), and what the call creates is that user's.
 * `metadata` (writes) and `metadataPrefix` (stat, list) are the file's user xattrs under a prefix.
 */
export class FileService {
  constructor(private readonly deps: { lookup: SandboxLookup; trajectory: TrajectoryLog; outputBudget: OutputBudget }) {}

  /** `opts.hold`: the answer holds the file's bytes until it is sent (holdAnswer). */
  async readFile(caller: Caller, id: string, path: string, maxBytes: number, opts: { as?: FileActor; hold?: Hold } = {}): Promise<Buffer> {
    const data = await (await this.deps.lookup.runningOn(caller, id)).readFile(id, path, maxBytes, actorOnly(opts));
    holdAnswer(this.deps.outputBudget, caller.project, data.length, `the file ${path}`, opts.hold);
    return data;
  }

  async stat(caller: Caller, id: string, path: string, opts: { as?: FileActor; metadataPrefix?: string } = {}): Promise<FileStat> {
    return (await this.deps.lookup.runningOn(caller, id)).statPath(id, path, statOptions(opts));
  }

  async listDir(
    caller: Caller,
    id: string,
    path: string,
    opts: { as?: FileActor; metadataPrefix?: string } = {},
  ): Promise<{ entries: FileStat[]; truncated: boolean }> {
    return (await this.deps.lookup.runningOn(caller, id)).listDir(id, path, statOptions(opts));
  }

  async downloadTar(caller: Caller, id: string, path: string): Promise<AsyncIterable<Buffer>> {
    return (await this.deps.lookup.runningOn(caller, id)).downloadTar(id, path);
  }

  async writeFile(
    caller: Caller,
    id: string,
    path: string,
    data: Buffer,
    mode: number,
    opts: { as?: FileActor; metadata?: FileMetadataWrite } = {},
  ): Promise<number> {
    const started = performance.now();
    const edgeOpts = { ...actorOnly(opts), ...(opts.metadata ? { metadata: opts.metadata } : {}) };
    const bytes = await (await this.deps.lookup.runningOn(caller, id)).writeFile(id, path, data, mode, edgeOpts);
    await this.deps.trajectory.append(id, {
      kind: 'files.write',
      request: { path, mode: mode.toString(8), bytes, ...edgeOpts },
      payload: data,
      durationMs: since(started),
    });
    return bytes;
  }

  async makeDir(caller: Caller, id: string, path: string, parents: boolean, opts: { as?: FileActor } = {}): Promise<void> {
    const started = performance.now();
    await (await this.deps.lookup.runningOn(caller, id)).makeDir(id, path, parents, actorOnly(opts));
    await this.deps.trajectory.append(id, {
      kind: 'files.mkdir',
      request: { path, parents, ...actorOnly(opts) },
      durationMs: since(started),
    });
  }

  async removePath(caller: Caller, id: string, path: string, recursive: boolean, opts: { as?: FileActor } = {}): Promise<void> {
    const started = performance.now();
    await (await this.deps.lookup.runningOn(caller, id)).removePath(id, path, recursive, actorOnly(opts));
    await this.deps.trajectory.append(id, {
      kind: 'files.remove',
      request: { path, recursive, ...actorOnly(opts) },
      durationMs: since(started),
    });
  }

  async renamePath(caller: Caller, id: string, from: string, to: string, opts: { as?: FileActor } = {}): Promise<void> {
    const started = performance.now();
    await (await this.deps.lookup.runningOn(caller, id)).renamePath(id, from, to, actorOnly(opts));
    await this.deps.trajectory.append(id, { kind: 'files.rename', request: { from, to, ...actorOnly(opts) }, durationMs: since(started) });
  }

  /** Tar uploads are kept for replay up to MAX_PAYLOAD; a larger one marks the step unreplayable. */
  async uploadTar(caller: Caller, id: string, dir: string, body: Readable): Promise<number> {
    const started = performance.now();
    const edge = await this.deps.lookup.runningOn(caller, id);
    const copy: Buffer[] = [];
    let size = 0;
    const tee = async function* (): AsyncGenerator<Buffer> {
      for await (const chunk of body) {
        const b = chunk as Buffer;
        size += b.length;
        if (size <= MAX_PAYLOAD) copy.push(b);
        yield b;
      }
    };
    const bytes = await edge.uploadTar(id, dir, Readable.from(tee()));
    await this.deps.trajectory.append(id, {
      kind: 'files.upload',
      request: { path: dir, bytes },
      payload: size <= MAX_PAYLOAD ? Buffer.concat(copy) : Buffer.alloc(MAX_PAYLOAD + 1),
      durationMs: since(started),
    });
    return bytes;
  }
}

/** `as` when given, nothing otherwise: a root call crosses to the edge and into the trajectory as before. */
function actorOnly(opts: { as?: FileActor | undefined }): { as?: FileActor } {
  return opts.as ? { as: opts.as } : {};
}

function statOptions(opts: { as?: FileActor | undefined; metadataPrefix?: string | undefined }): {
  as?: FileActor;
  metadataPrefix?: string;
} {
  return { ...actorOnly(opts), ...(opts.metadataPrefix !== undefined ? { metadataPrefix: opts.metadataPrefix } : {}) };
}

/** A step's duration as the log keeps it: from the request's arrival here to the edge's answer, in ms to 0.01. */
function since(started: number): number {
  return Math.round((performance.now() - started) * 100) / 100;
}
