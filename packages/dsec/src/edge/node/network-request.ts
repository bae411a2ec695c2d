import { ApiError } from '../../api-error.js';
import { parseAllowList, PolicyError, type NetworkPolicy } from '../../net/policy.js';
import type { EdgeNetworkRequest } from '../protocol/edge-api.js';

/** Resolves an allow list's host names on this node; a bad entry is the caller's 400. */
export async function resolvePolicy(req: EdgeNetworkRequest): Promise<NetworkPolicy> {
  try {
    return { mode: req.mode, allow: req.mode === 'allow' ? await parseAllowList(req.allow) : [] };
  } catch (err) {
    if (err instanceof PolicyError) throw new ApiError('INVALID_REQUEST', err.message, { field: 'allow' });
    throw err;
  }
}
