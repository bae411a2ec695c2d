import { ApiError } from '../../api-error.js';
import type { SandboxBackend as BackendKind } from '@dsec/sdk/schema';
import type { EdgeApi } from '../protocol/edge-api.js';

export type { BackendKind };

/**
 * What the node (edge/edge.ts) drives in every backend: it starts each (adopting what a previous
 * run left), asks which sandbox ids are its own, and stops it. The container and VM backends
 * serve sandboxes (SandboxBackend); the FnCall backend serves function calls in workers of its own.
 */
export interface Backend {
  /** Adopts what an earlier run of this node left that is still alive; removes the rest. */
  start(): Promise<unknown>;
  /** Stops taking work; `killAll` ends this backend's sandboxes too (else they outlive the edge). */
  shutdown(opts?: { killAll?: boolean }): Promise<void>;
  /** Whether this backend holds the sandbox or worker `id`. */
  owns(id: string): boolean;
}

/**
 * What one isolation backend serves: EdgeApi's per-sandbox calls (the node answers `info`,
 * `createSandboxes` and the volumes itself). The node routes each call to the backend that owns
 * the sandbox.
 */
export interface SandboxBackend
  extends Backend, Omit<EdgeApi, 'info' | 'createSandboxes' | 'createVolume' | 'deleteVolume' | 'volumeUsage' | 'runFn'> {}

/** A call the sandbox's backend does not serve: a 4xx naming the backend, never a half-done call. */
export function unsupported(kind: BackendKind, what: string): never {
  throw new ApiError('BACKEND_UNSUPPORTED', `${what} is not available for ${kind} sandboxes; use a container sandbox for it`, {
    backend: kind,
  });
}
