import { totalmem } from 'node:os';
import { Readable } from 'node:stream';
import { DsecError, NotFoundError, Sandbox, type ConnectionOptions } from '@dsec/sdk';
import type { ExecRequest, Resources } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { ControlPlane } from '../../control/control-plane.js';
import { ownedLabels } from '../../control/owned-sandboxes.js';
import { SYSTEM } from '../../control/service/callers.js';

/**
 * What a Dockerfile build needs from dsec to run a step in a real sandbox: create one from an
 * image, run a command, put files, snapshot, kill. Two implementations: the in-process control
 * plane (tests, a CLI that started its own server) and the HTTP API through the SDK.
 */
export interface BuildSandboxes {
  create(image: string): Promise<string>;
  run(id: string, req: ExecRequest, onOutput: (data: Buffer) => void): Promise<{ exitCode: number; timedOut: boolean }>;
  uploadTar(id: string, dir: string, tar: Buffer): Promise<void>;
  mkdir(id: string, path: string): Promise<void>;
  /** The type of what is at `path` (not following a final symlink), undefined when nothing is. */
  stat(id: string, path: string): Promise<'file' | 'dir' | 'symlink' | 'other' | undefined>;
  readFile(id: string, path: string): Promise<Buffer | undefined>;
  snapshot(id: string, scrub: string[]): Promise<{ imageId: string; layers: string[]; layerAdded: boolean }>;
  kill(id: string): Promise<void>;
}

/** A build step gets room for compilers and package managers, within what the host has. */
export function buildResources(): Resources {
  const hostMiB = Math.floor(totalmem() / (1 << 20));
  return { cpu: 2, memoryMiB: Math.max(256, Math.min(4096, Math.floor(hostMiB / 2))), pids: 4096 };
}

/** Owned by the build's process (control/owned-sandboxes.ts): a build killed mid-step leaves sandboxes the control plane then kills. */
export const BUILD_LABELS = { 'dsec.build': 'dockerfile', ...ownedLabels() };

/** Whether an error means "no such image" (the build retries with a fresh runner image). */
export function isImageNotFound(err: unknown): boolean {
  return (err instanceof ApiError || err instanceof DsecError) && err.code === 'IMAGE_NOT_FOUND';
}

/** In process, as dsec itself: what the builds of tests and a CLI that started its own server did before callers had keys. */
export function controlPlaneSandboxes(control: ControlPlane): BuildSandboxes {
  const caller = SYSTEM;
  const notFound = (err: unknown): boolean => err instanceof ApiError && err.code === 'FILE_NOT_FOUND';
  return {
    async create(image) {
      return (await control.sandboxes.create(caller, { image, labels: BUILD_LABELS, resources: buildResources() })).id;
    },
    async run(id, req, onOutput) {
      for await (const ev of await control.exec.execStream(caller, id, req)) {
        if (ev.type === 'exit') return { exitCode: ev.result.exitCode, timedOut: ev.result.timedOut };
        onOutput(ev.data);
      }
      throw new Error('the command ended without an exit status');
    },
    async uploadTar(id, dir, tar) {
      await control.files.uploadTar(caller, id, dir, Readable.from([tar]));
    },
    async mkdir(id, path) {
      await control.files.makeDir(caller, id, path, true);
    },
    async stat(id, path) {
      try {
        return (await control.files.stat(caller, id, path)).type;
      } catch (err) {
        if (notFound(err)) return undefined;
        throw err;
      }
    },
    async readFile(id, path) {
      try {
        return await control.files.readFile(caller, id, path, 4 << 20);
      } catch (err) {
        if (notFound(err)) return undefined;
        throw err;
      }
    },
    async snapshot(id, scrub) {
      return control.snapshots.snapshot(caller, id, { scrub, keep: true }); // a step's image outlives its build sandbox
    },
    async kill(id) {
      await control.sandboxes.kill(caller, id);
    },
  };
}

export function sdkSandboxes(conn: ConnectionOptions): BuildSandboxes {
  const open = new Map<string, Sandbox>();
  const sb = (id: string): Sandbox => {
    const s = open.get(id);
    if (!s) throw new Error(`no build sandbox ${id}`);
    return s;
  };
  return {
    async create(image) {
      const s = await Sandbox.create({ ...conn, image, labels: BUILD_LABELS, resources: buildResources() });
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
    async snapshot(id, scrub) {
      return sb(id).snapshot({ scrub, keep: true }); // a step's image outlives its build sandbox
    },
    async kill(id) {
      await sb(id).kill();
      open.delete(id);
    },
  };
}
