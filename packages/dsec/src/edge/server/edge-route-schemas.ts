import { Type } from 'typebox';
import { ErrorBody } from '@dsec/sdk/schema';

/** What the edge server's routes share: media types, path parameters and error answers. */
export const NDJSON = 'application/x-ndjson';
export const OCTETS = 'application/octet-stream';

export const Id = Type.Object({ id: Type.String({ pattern: '^sb-[a-z0-9]{1,32}-[a-z0-9]{6,32}$' }) });
export const IdPid = Type.Object({ id: Id.properties.id, pid: Type.String({ minLength: 1, maxLength: 64 }) });
export const IdSid = Type.Object({ id: Id.properties.id, sid: Type.String({ minLength: 1, maxLength: 64 }) });
export const PathQ = Type.Object({ path: Type.String({ minLength: 1, maxLength: 4096 }) }, { additionalProperties: false });
export const errors = {
  400: ErrorBody,
  401: ErrorBody,
  403: ErrorBody,
  404: ErrorBody,
  409: ErrorBody,
  413: ErrorBody,
  500: ErrorBody,
  503: ErrorBody,
};
