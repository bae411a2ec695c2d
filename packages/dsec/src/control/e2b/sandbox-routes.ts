import { releaseWhenSent } from '../../http/release-when-sent.js';
import { posix } from 'node:path';
import { gunzipSync, gzipSync } from 'node:zlib';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { MAX_FILE_BYTES } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { SYSTEM } from '../service/callers.js';
import type { ControlPlane } from '../control-plane.js';
import { CONNECT_CODES, ConnectError } from './connect-protocol.js';
import { METADATA_XATTR_PREFIX, type FilesystemService } from './filesystem-service.js';
import { connectErrorOf, registerRpc, sendUnaryError, type RpcService } from './rpc-router.js';
import { admittedSide, queryString, signedPathOf } from './sandbox-access.js';
import { SANDBOX_PREFIX } from './sandbox-prefix.js';
import { access } from '../../http/access.js';
import { fileActor, resolvePath, userFromAuthorization } from './sandbox-users.js';

export { SANDBOX_PREFIX };

/** Files smaller than this are sent uncompressed even to a client that accepts gzip. */
const GZIP_MIN_BYTES = 1024;

/** Multipart framing around a file of MAX_FILE_BYTES. */
export const BODY_LIMIT = MAX_FILE_BYTES + (1 << 20);

function httpError(reply: FastifyReply, err: unknown): FastifyReply {
  const e = connectErrorOf(err);
  const status = e.code === 'unavailable' ? 502 : CONNECT_CODES[e.code];
  return reply.status(status).type('application/json').send({ code: status, message: e.message });
}

/**
 * Errors of this surface, the access hook's refusals included, in envd's shape: `{code, message}`
 * with the HTTP status (Connect calls get Connect's own shape from rpc-router). `/health` answers
 * 502 to any refusal, a missing token included: E2B's SDK probes it for isRunning, and a
 * sandbox this caller cannot reach is, for it, not running.
 */
function envdErrorHandler(err: unknown, req: FastifyRequest, reply: FastifyReply): FastifyReply {
  if (req.routeOptions.url === `${SANDBOX_PREFIX}/:service/:method`) return sendUnaryError(reply, connectErrorOf(err));
  if (req.routeOptions.url === `${SANDBOX_PREFIX}/health`)
    return reply
      .status(502)
      .type('application/json')
      .send({ code: 502, message: connectErrorOf(err).message });
  return httpError(reply, err);
}

/** How long a stream whose sandbox vanished from its node waits for the control plane to record the end. */
const GONE_WAIT_MS = 5000;

/** Whether sandbox `id` stops counting as running within GONE_WAIT_MS (rpc-router.ts SandboxGone). */
async function stoppedRunning(control: ControlPlane, id: string): Promise<boolean> {
  const until = Date.now() + GONE_WAIT_MS;
  for (;;) {
    try {
      if ((await control.sandboxes.get(SYSTEM, id)).status !== 'running') return true;
    } catch (err) {
      if (err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND') return true;
      throw err;
    }
    if (Date.now() > until) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The files of a POST /files body: one raw (maybe gzip) body, or the parts of a multipart form. */
async function uploadedFiles(req: FastifyRequest, queryPath: string | undefined): Promise<{ path: string; data: Buffer }[]> {
  const body = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
  const type = (req.headers['content-type'] ?? '').toLowerCase();
  if (type.startsWith('multipart/form-data')) {
    // undici's multipart parser (Node's own fetch implementation) reads the form.
    const form = await new Response(body, { headers: { 'content-type': req.headers['content-type']! } }).formData();
    const files: { path: string; data: Buffer }[] = [];
    const entries = [...form.entries()].filter(([, v]) => typeof v !== 'string') as [string, File][];
    for (const [, file] of entries) {
      const path = entries.length === 1 && queryPath ? queryPath : file.name || queryPath;
      if (!path) throw new ConnectError('invalid_argument', 'each uploaded file needs a path: give ?path= or a filename in the form part');
      files.push({ path, data: Buffer.from(await file.arrayBuffer()) });
    }
    if (files.length === 0) throw new ConnectError('invalid_argument', 'the multipart body holds no file part');
    return files;
  }
  if (!queryPath) throw new ConnectError('invalid_argument', 'path is required (?path=)');
  let data = body;
  if ((req.headers['content-encoding'] ?? '').toLowerCase() === 'gzip') {
    try {
      data = gunzipSync(body, { maxOutputLength: MAX_FILE_BYTES });
    } catch (err) {
      throw new ConnectError(
        'invalid_argument',
        `the gzip body does not decompress (or is over ${MAX_FILE_BYTES} bytes): ${(err as Error).message}`,
      );
    }
  }
  return [{ path: queryPath, data }];
}

/**
 * The sandbox side of E2B on dsec's port: envd's Connect services plus `/files` and `/health`.
 * Requests reach it only through the `E2b-Sandbox-Id` rewrite, carry E2B's access token instead
 * of a dsec key, and run every operation through the control plane (confinement, limits, log).
 */
export function registerSandboxRoutes(
  app: FastifyInstance,
  deps: { control: ControlPlane; files: FilesystemService; services: RpcService[] },
): void {
  const { control, files } = deps;
  app.setErrorHandler(envdErrorHandler);
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: BODY_LIMIT }, (_req, body, done) => done(null, body));

  // Every route here is declared `sandboxToken`: the access hook checked the sandbox and its
  // token (or signed URL) before the handler runs (sandbox-access.ts), and hands the sandbox over.
  const opts = { config: access.sandboxToken, schema: { hide: true } };
  registerRpc(
    app,
    SANDBOX_PREFIX,
    deps.services,
    opts,
    async (req) => ({ ...admittedSide(req), user: userFromAuthorization(req.headers.authorization) }),
    (id) => stoppedRunning(control, id),
  );

  // The sandbox runs (the hook refuses one that does not with 502).
  app.get(`${SANDBOX_PREFIX}/health`, opts, async (_req, reply) => reply.status(204).send());

  app.get(`${SANDBOX_PREFIX}/files`, opts, async (req, reply) => {
    try {
      const rawPath = queryString(req.query, 'path');
      if (!rawPath) throw new ConnectError('invalid_argument', 'path is required (?path=)');
      const a = await files.acting(admittedSide(req), queryString(req.query, 'username'));
      const data = await control.files.readFile(a.caller, a.sandboxId, resolvePath(rawPath, a.user), MAX_FILE_BYTES, {
        as: fileActor(a.user),
        hold: (release) => releaseWhenSent(reply, release),
      });
      void reply
        .type('application/octet-stream')
        .header('content-disposition', `attachment; filename="${encodeURIComponent(posix.basename(rawPath))}"`);
      // Small files go as they are: fetch asks for gzip on every request, and inflating costs more than it saves.
      if (/\bgzip\b/.test(String(req.headers['accept-encoding'] ?? '')) && data.length >= GZIP_MIN_BYTES)
        return reply.header('content-encoding', 'gzip').send(gzipSync(data));
      return reply.send(data);
    } catch (err) {
      return httpError(reply, err);
    }
  });

  app.post(`${SANDBOX_PREFIX}/files`, opts, async (req, reply) => {
    try {
      const queryPath = queryString(req.query, 'path');
      const metadata = metadataOf(req.headers);
      const a = await files.acting(admittedSide(req), queryString(req.query, 'username'));
      const written: { name: string; type: 'file'; path: string; metadata?: Record<string, string> }[] = [];
      const uploads = await uploadedFiles(req, queryPath);
      // A URL signed for a path writes that path only: with several parts, each would go where its
      // file name says, which the signature does not cover.
      const signedPath = signedPathOf(req);
      if (signedPath && uploads.some((f) => f.path !== signedPath))
        throw new ConnectError('permission_denied', `this signed URL writes ${signedPath} only: send one file`);
      for (const f of uploads) {
        const p = resolvePath(f.path, a.user);
        // As the user: refused where the user's own write would be; made (parents too) the user's.
        // The metadata is always written, so an overwrite without any clears the earlier set.
        await control.files.writeFile(a.caller, a.sandboxId, p, f.data, 0o644, {
          as: fileActor(a.user),
          metadata: { prefix: METADATA_XATTR_PREFIX, values: metadata },
        });
        written.push({ name: posix.basename(p), type: 'file', path: p, ...(Object.keys(metadata).length ? { metadata } : {}) });
      }
      return reply.status(200).send(written);
    } catch (err) {
      return httpError(reply, err);
    }
  });
}

/** Longest metadata key: an xattr name is at most 255 bytes, envd's prefix included. */
const MAX_METADATA_KEY = 255 - METADATA_XATTR_PREFIX.length;
/** All of a file's metadata (prefixed names and values) together, at most (envd's bound). */
const MAX_METADATA_BYTES = 4096;

/**
 * A write's metadata from its `X-Metadata-<key>: <value>` headers, checked as envd checks it: keys
 * (lower-cased, as HTTP headers are) and values printable ASCII, a key at most MAX_METADATA_KEY
 * bytes, all of it at most MAX_METADATA_BYTES.
 */
export function metadataOf(headers: Record<string, string | string[] | undefined>): Record<string, string> {
  const out: Record<string, string> = {};
  let total = 0;
  for (const [name, raw] of Object.entries(headers)) {
    if (!name.startsWith('x-metadata-') || raw === undefined) continue;
    const key = name.slice('x-metadata-'.length);
    const value = Array.isArray(raw) ? raw[0]! : raw;
    if (key === '') continue;
    if (key.length > MAX_METADATA_KEY)
      throw new ConnectError('invalid_argument', `metadata key ${JSON.stringify(key)} is over ${MAX_METADATA_KEY} bytes`);
    for (const [what, text] of [
      ['key', key],
      [`value for key ${JSON.stringify(key)}`, value],
    ] as const) {
      if (!/^[\x20-\x7e]*$/.test(text))
        throw new ConnectError('invalid_argument', `metadata ${what} has a byte that is not printable ASCII`);
    }
    out[key] = value;
    total += METADATA_XATTR_PREFIX.length + key.length + value.length;
  }
  if (total > MAX_METADATA_BYTES)
    throw new ConnectError('invalid_argument', `the file's metadata is ${total} bytes, over ${MAX_METADATA_BYTES}`);
  return out;
}
