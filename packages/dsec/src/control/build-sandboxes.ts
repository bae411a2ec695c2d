import { Readable } from 'node:stream';
import { ApiError } from '../api-error.js';
import { BUILD_STEP_LABELS, buildResources, type BuildSandboxes } from '../image/dockerfile/sandboxes.js';
import type { ControlPlane } from './control-plane.js';
import { ownedLabels } from './owned-sandboxes.js';
import { SYSTEM, type Caller } from './service/callers.js';

/** Owned by the build's process (owned-sandboxes.ts): a build killed mid-step leaves sandboxes the control plane then kills. */
export const BUILD_LABELS = { ...BUILD_STEP_LABELS, ...ownedLabels() };

/** The services a Dockerfile build's steps call (image/dockerfile/sandboxes.ts). */
export type BuildControl = Pick<ControlPlane, 'sandboxes' | 'exec' | 'files' | 'snapshots'>;

/**
 * Build sandboxes of the control plane in this process (tests, a CLI that started its own server),
 * as `caller`: by default dsec itself (the default project; a step's snapshot is shared), as
 * in-process builds always were. A build over the API acts as its key (sdkSandboxes).
 */
export function controlPlaneSandboxes(control: BuildControl, caller: Caller = SYSTEM): BuildSandboxes {
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
    async downloadTar(id, path) {
      return control.files.downloadTar(caller, id, path);
    },
    async snapshot(id, scrub) {
      return control.snapshots.snapshot(caller, id, { scrub, keep: true }); // a step's image outlives its build sandbox
    },
    async kill(id) {
      await control.sandboxes.kill(caller, id);
    },
  };
}
