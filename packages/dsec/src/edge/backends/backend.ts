import { ApiError } from '../../api-error.js';
import type { SandboxBackend as BackendKind } from '@dsec/sdk/schema';
import type { EdgeApi } from '../protocol/edge-api.js';

export type { BackendKind };

/**
 * What one isolation backend serves: EdgeApi's per-sandbox calls. The container backend is the
 * Edge itself; the VM backends are VmBackend. The edge's dispatch (dispatch.ts) routes each
 * call to the backend that owns the sandbox.
 */
export type SandboxBackend = Omit<EdgeApi, 'info' | 'createSandboxes' | 'createVolume' | 'deleteVolume' | 'volumeUsage'>;

/** A call the sandbox's backend does not serve: a 4xx naming the backend, never a half-done call. */
export function unsupported(kind: BackendKind, what: string): never {
  throw new ApiError('BACKEND_UNSUPPORTED', `${what} is not available for ${kind} sandboxes; use a container sandbox for it`, {
    backend: kind,
  });
}
