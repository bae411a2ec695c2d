import { Readable } from 'node:stream';
import { ApiError } from '../api-error.js';
import { BUILD_STEP_LABELS, buildResources, type BuildSandboxes } from '../image/dockerfile/sandboxes.js';
import type { ControlPlane } from './control-plane.js';
import { ownedLabels } from './owned-sandboxes.js';

/** Owned by the build's process (owned-sandboxes.ts): a build killed mid-step leaves sandboxes the control plane then kills. */
export const BUILD_LABELS = { ...BUILD_STEP_LABELS, ...ownedLabels() };

/** The control plane calls a Dockerfile build's steps make (image/dockerfile/sandboxes.ts). */
export type BuildControl = Pick<
  ControlPlane,
  'create' | 'execStream' | 'uploadTar' | 'makeDir' | 'edgeFor' | 'readFile' | 'snapshot' | 'kill'
>;

/** Build sandboxes of the control plane in this process (tests, a CLI that started its own server). */
export function controlPlaneSandboxes(control: BuildControl): BuildSandboxes {
  const notFound = (err: unknown): boolean => err instanceof ApiError && err.code === 'FILE_NOT_FOUND';
  return {
    async create(image) {
      return (await control.create({ image, labels: BUILD_LABELS, resources: buildResources() })).id;
    },
    async run(id, req, onOutput) {
      for await (const ev of await control.execStream(id, req)) {
        if (ev.type === 'exit') return { exitCode: ev.result.exitCode, timedOut: ev.result.timedOut };
        onOutput(ev.data);
      }
      throw new Error('the command ended without an exit status');
    },
    async uploadTar(id, dir, tar) {
      await control.uploadTar(id, dir, Readable.from([tar]));
    },
    async mkdir(id, path) {
      await control.makeDir(id, path, true);
    },
    async stat(id, path) {
      try {
        return (await (await control.edgeFor(id)).statPath(id, path)).type;
      } catch (err) {
        if (notFound(err)) return undefined;
        throw err;
      }
    },
    async readFile(id, path) {
      try {
        return await control.readFile(id, path, 4 << 20);
      } catch (err) {
        if (notFound(err)) return undefined;
        throw err;
      }
    },
    async snapshot(id, scrub) {
      return control.snapshot(id, { scrub, keep: true }); // a step's image outlives its build sandbox
    },
    async kill(id) {
      await control.kill(id);
    },
  };
}
