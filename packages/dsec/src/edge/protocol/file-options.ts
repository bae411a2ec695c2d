import { ApiError } from '../../api-error.js';
import { rejectNul } from './reject-nul.js';

/** Who a file call acts as, by the sandbox's own ids (as its /etc/passwd and /etc/group name them); absent: the sandbox's root, as today. */
export interface FileActor {
  uid: number;
  gid: number;
  groups: number[];
}

/**
 * User extended attributes a write leaves on the file: every attribute named `prefix…` that is not
 * `prefix` + a key of `values` is removed, and each `prefix` + key is set to its value (utf-8).
 */
export interface FileMetadataWrite {
  prefix: string;
  values: Record<string, string>;
}

/** What every file call may carry. */
export interface FileCallOptions {
  as?: FileActor | undefined;
}

export interface WriteFileOptions extends FileCallOptions {
  metadata?: FileMetadataWrite | undefined;
}

/** stat and list: with `metadataPrefix`, each entry's user xattrs under it, the prefix stripped (FileStat.metadata). */
export interface StatOptions extends FileCallOptions {
  metadataPrefix?: string | undefined;
}

/** The most supplementary groups a Linux thread may have (NGROUPS_MAX). */
export const MAX_ACTOR_GROUPS = 65536;

const isId = (n: unknown): boolean => Number.isInteger(n) && (n as number) >= 0 && (n as number) < 2 ** 32 - 1;

/** An actor whose ids are ids (integers, 0 … 2^32-2; -1 is the kernel's "unchanged"): INVALID_REQUEST otherwise. */
export function checkFileActor(as: FileActor): void {
  if (!isId(as.uid) || !isId(as.gid) || !Array.isArray(as.groups) || !as.groups.every(isId) || as.groups.length > MAX_ACTOR_GROUPS) {
    throw new ApiError('INVALID_REQUEST', 'as: uid, gid and groups must be ids (integers from 0 to 4294967294)', { field: 'as' });
  }
}

/** Whether an actor is the sandbox's root: the call goes as without one. */
export function isRootActor(as: FileActor | undefined): boolean {
  return as === undefined || as.uid === 0;
}

/**
 * A metadata prefix must name user xattrs (`user.`): the trusted, security and system namespaces
 * are the host's and the kernel's, never the caller's. Names and values carry no NUL (the C calls
 * would cut them there).
 */
export function checkMetadataPrefix(prefix: string, field = 'metadata.prefix'): void {
  if (typeof prefix !== 'string' || !prefix.startsWith('user.')) {
    throw new ApiError('INVALID_REQUEST', `${field} must start with "user." (only user extended attributes are file metadata)`, { field });
  }
  rejectNul(field, [prefix]);
}

export function checkFileMetadata(m: FileMetadataWrite): void {
  checkMetadataPrefix(m.prefix);
  if (m.values === null || typeof m.values !== 'object' || Array.isArray(m.values)) {
    throw new ApiError('INVALID_REQUEST', 'metadata.values must be an object of strings', { field: 'metadata.values' });
  }
  for (const [k, v] of Object.entries(m.values)) {
    if (k === '' || typeof v !== 'string') {
      throw new ApiError('INVALID_REQUEST', 'metadata.values: each key is a non-empty name and each value a string', {
        field: 'metadata.values',
      });
    }
  }
  rejectNul('metadata.values', Object.entries(m.values).flat());
}

/** `as` in a query string (the edge protocol's GET and PUT file calls): `uid:gid:g1,g2,…`, the groups possibly none. */
export const ACTOR_QUERY_PATTERN = '^[0-9]{1,10}:[0-9]{1,10}:([0-9]{1,10}(,[0-9]{1,10})*)?$';

export function actorToQuery(as: FileActor): string {
  return `${as.uid}:${as.gid}:${as.groups.join(',')}`;
}

export function actorFromQuery(q: string): FileActor {
  const [uid = '', gid = '', groups = ''] = q.split(':');
  const actor = { uid: Number(uid), gid: Number(gid), groups: groups === '' ? [] : groups.split(',').map(Number) };
  checkFileActor(actor);
  return actor;
}
