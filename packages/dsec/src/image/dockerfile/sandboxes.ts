import { totalmem } from 'node:os';
import { DsecError, NotFoundError, Sandbox, type ConnectionOptions } from '@dsec/sdk';
import type { ExecRequest, Resources } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';

/**
 * What a Dockerfile build needs from dsec to run a step in a real sandbox: create one from an
 * image, run a command, put files, snapshot, kill. image/ declares it and the platform passes an
 * implementation in (image/ imports nothing of control/): the in-process control plane's
 * (control/build-sandboxes.ts: tests, a CLI that started its own server) and the HTTP API's
 * through the SDK (`sdkSandboxes`, acting with the caller's key).
 */
export interface BuildSandboxes {
  create(image: string): Promise<string>;
  run(id: string, req: ExecRequest, onOutput: (data: Buffer) => void): Promise<{ exitCode: number; timedOut: boolean }>;
  uploadTar(id: string, dir: string, tar: Buffer): Promise<void>;
  mkdir(id: string, path: string): Promise<void>;
  /** The type of what is at `path` (not following a final symlink), undefined when nothing is. */
  stat(id: string, path: string): Promise<'file' | 'dir' | 'symlink' | 'other' | undefined>;
  readFile(id: string, path: string): Promise<Buffer | undefined>;
  /** `path` (a file or directory) as a tar archive of one top-level entry, its base name (COPY --from). */
  downloadTar(id: string, path: string): Promise<AsyncIterable<Buffer>>;
  snapshot(id: string, scrub: string[]): Promise<{ imageId: string; layers: string[]; layerAdded: boolean }>;
  kill(id: string): Promise<void>;
}

/** A build step gets room for compilers and package managers, within what the host has. */
export function buildResources(): Resources {
  const hostMiB = Math.floor(totalmem() / (1 << 20));
  return { cpu: 2, memoryMiB: Math.max(256, Math.min(4096, Math.floor(hostMiB / 2))), pids: 4096 };
}

/** Marks a build step's sandbox; an implementation adds the labels that make it owned by the build's process. */
export const BUILD_STEP_LABELS = { 'dsec.build': 'dockerfile' };

/** Whether an error means "no such image" (the build retries with a fresh runner image). */
export function isImageNotFound(err: unknown): boolean {
  return (err instanceof ApiError || err instanceof DsecError) && err.code === 'IMAGE_NOT_FOUND';
}

/**
 * Build sandboxes through a dsec server's API, as the key's project. `labels` go on every build
 * sandbox (control/build-sandboxes.ts's BUILD_LABELS: whose process owns it).
 */
export function sdkSandboxes(conn: ConnectionOptions, labels: Record<string, string>): BuildSandboxes {
  const open = new Map<string, Sandbox>();
  const sb = (id: string): Sandbox => {
    const s = open.get(id);
    if (!s) throw new Error(`no build sandbox ${id}`);
    return s;
  };
  return {
    async create(image) {
      const s = await Sandbox.create({ ...conn, image, labels, resources: buildResources() });
      open.set(s.id, s);
      return s.id;
    },
    async run(id, req, onOutput) {
      const { cmd, ...rest } = req;
      for await (const ev of sb(id).commands.stream(cmd, { ...rest, timeoutMs: (req.timeoutMs ?? 60_000) + 30_000 })) {
        if (ev.type === 'exit') return { exitCode: ev.exitCode, timedOut: ev.timedOut };
        onOutput(Buffer.from(ev.data));
      }
      throw new Error('the command stream ended without an exit status');
    },
    async uploadTar(id, dir, tar) {
      await sb(id).files.uploadTar(dir, tar, { timeoutMs: 600_000 });
    },
    async mkdir(id, path) {
      await sb(id).files.mkdir(path, { parents: true });
    },
    async stat(id, path) {
      try {
        return (await sb(id).files.stat(path)).type;
      } catch (err) {
        if (err instanceof NotFoundError) return undefined;
        throw err;
      }
    },
    async readFile(id, path) {
      try {
        return Buffer.from(await sb(id).files.read(path));
      } catch (err) {
        if (err instanceof NotFoundError) return undefined;
        throw err;
      }
    },
    async downloadTar(id, path) {
      const tar = Buffer.from(await sb(id).files.downloadTar(path, { timeoutMs: 600_000 }));
      return (async function* () {
        yield tar;
      })();
    },
    async snapshot(id, scrub) {
      return sb(id).snapshot({ scrub, keep: true }); // a step's image outlives its build sandbox
    },
    async kill(id) {
      await sb(id).kill();
      open.delete(id);
    },
  };
}
