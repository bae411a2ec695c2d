import { Readable } from 'node:stream';
import type { FileStat } from '@dsec/sdk/schema';
import { MAX_PAYLOAD, type TrajectoryLog } from '../trajectory-log.js';
import type { Caller } from './callers.js';
import type { SandboxLookup } from './sandbox-lookup.js';

/**
 * A running sandbox's files. Writes are written to the trajectory (with their bytes, up to
 * MAX_PAYLOAD) so a replay makes them again; reads are not.
 */
export class FileService {
  constructor(private readonly deps: { lookup: SandboxLookup; trajectory: TrajectoryLog }) {}

  async readFile(caller: Caller, id: string, path: string, maxBytes: number): Promise<Buffer> {
    return (await this.deps.lookup.runningOn(caller, id)).readFile(id, path, maxBytes);
  }

  async stat(caller: Caller, id: string, path: string): Promise<FileStat> {
    return (await this.deps.lookup.runningOn(caller, id)).statPath(id, path);
  }

  async listDir(caller: Caller, id: string, path: string): Promise<{ entries: FileStat[]; truncated: boolean }> {
    return (await this.deps.lookup.runningOn(caller, id)).listDir(id, path);
  }

  async downloadTar(caller: Caller, id: string, path: string): Promise<AsyncIterable<Buffer>> {
    return (await this.deps.lookup.runningOn(caller, id)).downloadTar(id, path);
  }

  async writeFile(caller: Caller, id: string, path: string, data: Buffer, mode: number): Promise<number> {
    const started = performance.now();
    const bytes = await (await this.deps.lookup.runningOn(caller, id)).writeFile(id, path, data, mode);
    await this.deps.trajectory.append(id, {
      kind: 'files.write',
      request: { path, mode: mode.toString(8), bytes },
      payload: data,
      durationMs: since(started),
    });
    return bytes;
  }

  async makeDir(caller: Caller, id: string, path: string, parents: boolean): Promise<void> {
    const started = performance.now();
    await (await this.deps.lookup.runningOn(caller, id)).makeDir(id, path, parents);
    await this.deps.trajectory.append(id, { kind: 'files.mkdir', request: { path, parents }, durationMs: since(started) });
  }

  async removePath(caller: Caller, id: string, path: string, recursive: boolean): Promise<void> {
    const started = performance.now();
    await (await this.deps.lookup.runningOn(caller, id)).removePath(id, path, recursive);
    await this.deps.trajectory.append(id, { kind: 'files.remove', request: { path, recursive }, durationMs: since(started) });
  }

  async renamePath(caller: Caller, id: string, from: string, to: string): Promise<void> {
    const started = performance.now();
    await (await this.deps.lookup.runningOn(caller, id)).renamePath(id, from, to);
    await this.deps.trajectory.append(id, { kind: 'files.rename', request: { from, to }, durationMs: since(started) });
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

/** A step's duration as the log keeps it: from the request's arrival here to the edge's answer, in ms to 0.01. */
function since(started: number): number {
  return Math.round((performance.now() - started) * 100) / 100;
}
