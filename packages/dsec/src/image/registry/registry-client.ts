import { createReadStream, statSync } from 'node:fs';
import { Readable } from 'node:stream';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import { basicAuthorization, parseChallenge, type RegistryCredentials } from './registry-auth.js';
import type { RegistryRef } from './registry-ref.js';

/** A push or pull that cannot go on, with a message for the user (no stack trace needed). */
export class ImageTransferError extends Error {
  override readonly name: string = 'ImageTransferError';
}

/** A registry answered with an error, or could not be reached (after retries). */
export class RegistryError extends ImageTransferError {
  override readonly name: string = 'RegistryError';
  constructor(
    message: string,
    /** The HTTP status, or undefined when the registry could not be reached. */
    readonly status?: number,
    /** The registry's own error codes (`BLOB_UNKNOWN`, `MANIFEST_INVALID`, `UNAUTHORIZED`, …). */
    readonly codes: string[] = [],
  ) {
    super(message);
  }
}

/** The registry refused the credentials, or wants some and none were given. */
export class RegistryAuthError extends RegistryError {
  override readonly name = 'RegistryAuthError';
}

export interface RegistryClientOptions {
  credentials?: RegistryCredentials | undefined;
  /** Attempts for a request that fails to connect or gets 5xx/429 (default 8, about 20 s of backoff). */
  attempts?: number;
  /** First backoff in ms, doubled per attempt up to 4 s (default 250). */
  backoffMs?: number;
  /** Per-request timeout for everything but blob bodies, in ms (default 30 s). */
  timeoutMs?: number;
  /** Called before each retry, with what failed (logs, tests). */
  onRetry?: (why: string, attempt: number) => void;
  /**
   * Hosts (HOST[:PORT]) besides the registry's own origin whose Bearer token service may be sent
   * the credentials (a registry whose token service lives elsewhere). Default: DSEC_REGISTRY_TOKEN_HOSTS
   * (comma-separated), else none: a token realm on another origin is asked anonymously.
   */
  tokenHosts?: string[];
}

/** DSEC_REGISTRY_TOKEN_HOSTS as a list of lowercase HOST[:PORT]. */
export function tokenHostsFromEnv(env: NodeJS.ProcessEnv = process.env): string[] {
  return (env.DSEC_REGISTRY_TOKEN_HOSTS ?? '')
    .split(',')
    .map((h) => h.trim().toLowerCase())
    .filter((h) => h !== '');
}

/** Media types a manifest GET accepts: OCI first, Docker's v2 schema 2 (and its per-platform lists) for container images. */
export const MANIFEST_ACCEPT = [
  'application/vnd.oci.image.manifest.v1+json',
  'application/vnd.oci.image.index.v1+json',
  'application/vnd.docker.distribution.manifest.v2+json',
  'application/vnd.docker.distribution.manifest.list.v2+json',
].join(', ');

type Body = () => RequestInit['body'];

/**
 * A small client of the OCI distribution API (v2) for one repository: blobs (HEAD, GET with a
 * byte range, monolithic upload), manifests (GET and PUT by tag or digest), with Basic and
 * Bearer-token auth from the registry's challenge, and retries with backoff when the registry
 * cannot be reached or answers 5xx (a registry restarting, a proxy in between).
 */
export class RegistryClient {
  readonly #opts: Required<Omit<RegistryClientOptions, 'credentials' | 'onRetry' | 'tokenHosts'>> &
    Pick<RegistryClientOptions, 'credentials' | 'onRetry'>;
  /** Origins the credentials may go to as a token service's Basic auth: the registry's own, and tokenHosts'. */
  readonly #tokenHosts: string[];
  /** The Basic header, once a registry asked for Basic auth. */
  #basic: string | undefined;
  /** Bearer tokens by the scope they were issued for (`repository:NAME:pull`, `…:pull,push`). */
  readonly #tokens = new Map<string, string>();

  constructor(
    readonly ref: Pick<RegistryRef, 'baseUrl' | 'host' | 'repository'>,
    opts: RegistryClientOptions = {},
  ) {
    const { tokenHosts, ...rest } = opts;
    this.#opts = { attempts: 8, backoffMs: 250, timeoutMs: 30_000, ...rest };
    this.#tokenHosts = (tokenHosts ?? tokenHostsFromEnv()).map((h) => h.toLowerCase());
  }

  /** `{size}` when the repository holds the blob, undefined when it does not. */
  async headBlob(digest: string): Promise<{ size: number } | undefined> {
    const res = await this.#request('HEAD', `blobs/${digest}`, { okStatuses: [200, 404] });
    if (res.status === 404) return undefined;
    return { size: Number(res.headers.get('content-length') ?? '0') };
  }

  /**
   * The blob's bytes, or those from `start` (to `end`, inclusive) with a Range request. A registry
   * that ignores the range (200 for a ranged GET) is an error: callers rely on getting those bytes.
   */
  async getBlob(
    digest: string,
    range?: { start: number; end?: number },
  ): Promise<{ body: Readable; size: number; status: number; contentRange: string | undefined }> {
    const headers: Record<string, string> = range ? { range: `bytes=${range.start}-${range.end ?? ''}` } : {};
    const res = await this.#request('GET', `blobs/${digest}`, { headers, streaming: true, okStatuses: range ? [206] : [200] });
    if (!res.body) throw new RegistryError(`${this.#where('GET', `blobs/${digest}`)} answered without a body`, res.status);
    return {
      body: Readable.fromWeb(res.body as WebReadableStream),
      size: Number(res.headers.get('content-length') ?? '-1'),
      status: res.status,
      contentRange: res.headers.get('content-range') ?? undefined,
    };
  }

  /**
   * Uploads a blob from a file: skipped when the repository has it, else a POST that opens an
   * upload session and one PUT of the whole body with the digest (the monolithic upload every
   * registry supports). The registry checks the digest; so does the caller when it made the file.
   */
  async putBlobFile(digest: string, file: string): Promise<{ uploaded: boolean }> {
    if (await this.headBlob(digest)) return { uploaded: false };
    const size = statSync(file).size;
    await this.#upload(digest, size, () => Readable.toWeb(createReadStream(file)) as unknown as RequestInit['body']);
    return { uploaded: true };
  }

  /** Uploads a small blob held in memory (a config). */
  async putBlobBytes(digest: string, bytes: Buffer): Promise<{ uploaded: boolean }> {
    if (await this.headBlob(digest)) return { uploaded: false };
    await this.#upload(digest, bytes.length, () => bytes);
    return { uploaded: true };
  }

  async #upload(digest: string, size: number, body: Body): Promise<void> {
    const started = await this.#request('POST', 'blobs/uploads/', { okStatuses: [202], scope: 'pull,push' });
    const location = started.headers.get('location');
    if (!location) throw new RegistryError(`${this.#where('POST', 'blobs/uploads/')} gave no upload location`, started.status);
    const url = new URL(location, this.ref.baseUrl);
    url.searchParams.set('digest', digest);
    await this.#request('PUT', url, {
      okStatuses: [201],
      scope: 'pull,push',
      headers: { 'content-type': 'application/octet-stream', 'content-length': String(size) },
      body,
    });
  }

  /** Stores a manifest under a tag or digest; returns the digest the registry gives it. */
  async putManifest(reference: string, mediaType: string, bytes: Buffer): Promise<string | undefined> {
    const res = await this.#request('PUT', `manifests/${reference}`, {
      okStatuses: [201],
      scope: 'pull,push',
      headers: { 'content-type': mediaType },
      body: () => bytes,
    });
    return res.headers.get('docker-content-digest') ?? undefined;
  }

  /** A manifest by tag or digest: its bytes and media type, or undefined when the registry has none by that name. */
  async getManifest(reference: string): Promise<{ bytes: Buffer; mediaType: string; digest: string | undefined } | undefined> {
    const res = await this.#request('GET', `manifests/${reference}`, { okStatuses: [200, 404], headers: { accept: MANIFEST_ACCEPT } });
    if (res.status === 404) {
      await res.body?.cancel();
      return undefined;
    }
    return {
      bytes: Buffer.from(await res.arrayBuffer()),
      mediaType: (res.headers.get('content-type') ?? '').split(';')[0]!.trim(),
      digest: res.headers.get('docker-content-digest') ?? undefined,
    };
  }

  /**
   * Deletes a blob from the repository: true when deleted, false when the repository had none. A
   * registry that does not allow deletes answers 405 (distribution: `storage.delete.enabled` is
   * off), a RegistryError with that status.
   */
  async deleteBlob(digest: string): Promise<boolean> {
    const res = await this.#request('DELETE', `blobs/${digest}`, { okStatuses: [202, 404], scope: 'pull,push,delete' });
    await res.body?.cancel();
    return res.status === 202;
  }

  /** Deletes a manifest by digest (and so every tag on it); false when the repository had none. 405 as deleteBlob. */
  async deleteManifest(digest: string): Promise<boolean> {
    const res = await this.#request('DELETE', `manifests/${digest}`, { okStatuses: [202, 404], scope: 'pull,push,delete' });
    await res.body?.cancel();
    return res.status === 202;
  }

  #where(method: string, path: string | URL): string {
    const p = typeof path === 'string' ? `/v2/${this.ref.repository}/${path}` : path.pathname;
    return `registry ${this.ref.host}: ${method} ${p}`;
  }

  /**
   * One request with auth and retries. A 401 is answered once per challenge (Basic credentials or a
   * fresh Bearer token); connection failures, 5xx and 429 are retried with backoff; any other
   * status not in `okStatuses` becomes a RegistryError with the registry's own error message.
   */
  async #request(
    method: string,
    path: string | URL,
    o: {
      okStatuses: number[];
      headers?: Record<string, string>;
      body?: Body;
      streaming?: boolean;
      scope?: 'pull' | 'pull,push' | 'pull,push,delete';
    },
  ): Promise<Response> {
    const url = typeof path === 'string' ? new URL(`/v2/${this.ref.repository}/${path}`, this.ref.baseUrl) : path;
    const where = this.#where(method, path);
    const scope = `repository:${this.ref.repository}:${o.scope ?? 'pull'}`;
    let authTries = 0;
    for (let attempt = 1; ; attempt++) {
      let res: Response;
      try {
        const headers: Record<string, string> = { ...o.headers };
        const authorization = this.#authorizationFor(scope);
        if (authorization) headers.authorization = authorization;
        const body = o.body?.();
        res = await fetch(url, {
          method,
          headers,
          redirect: 'follow',
          ...(body !== undefined ? { body, duplex: 'half' } : {}),
          ...(o.streaming || body !== undefined ? {} : { signal: AbortSignal.timeout(this.#opts.timeoutMs) }),
        } as RequestInit);
      } catch (err) {
        const why = describeFetchError(err);
        if (attempt >= this.#opts.attempts)
          throw new RegistryError(`${where}: cannot reach the registry (${why}) after ${attempt} attempts`);
        await this.#backoff(`${where}: ${why}`, attempt);
        continue;
      }
      if (o.okStatuses.includes(res.status)) return res;
      const text = method === 'HEAD' ? '' : await res.text().catch(() => '');
      if (res.status === 401) {
        const challenge = parseChallenge(res.headers.get('www-authenticate'));
        if (authTries++ === 0 && challenge) {
          await this.#answer(challenge, scope, where);
          attempt--; // an auth round is not a failed attempt
          continue;
        }
        const user = this.#opts.credentials?.username;
        throw new RegistryAuthError(
          user
            ? `${where}: the registry rejected the credentials of user ${JSON.stringify(user)} (HTTP 401${registryMessage(text)}); check DSEC_REGISTRY_USER and DSEC_REGISTRY_PASSWORD`
            : `${where}: the registry requires credentials (HTTP 401${registryMessage(text)}); set DSEC_REGISTRY_USER and DSEC_REGISTRY_PASSWORD`,
          401,
          registryCodes(text),
        );
      }
      if ((res.status >= 500 || res.status === 429) && attempt < this.#opts.attempts) {
        await this.#backoff(`${where}: HTTP ${res.status}${registryMessage(text)}`, attempt);
        continue;
      }
      const err = res.status === 403 ? RegistryAuthError : RegistryError;
      throw new err(`${where} answered HTTP ${res.status}${registryMessage(text)}`, res.status, registryCodes(text));
    }
  }

  /** Sets the Authorization header a challenge asks for. */
  async #answer(challenge: AuthChallengeLike, scope: string, where: string): Promise<void> {
    const creds = this.#opts.credentials;
    if (challenge.scheme === 'basic') {
      if (!creds)
        throw new RegistryAuthError(
          `${where}: the registry requires credentials (HTTP 401, Basic realm ${JSON.stringify(challenge.params.realm ?? '')}); set DSEC_REGISTRY_USER and DSEC_REGISTRY_PASSWORD`,
          401,
        );
      this.#basic = basicAuthorization(creds);
      return;
    }
    const realm = challenge.params.realm;
    if (!realm) throw new RegistryAuthError(`${where}: the registry's Bearer challenge names no token realm`, 401);
    let tokenUrl: URL;
    try {
      tokenUrl = new URL(realm);
    } catch {
      throw new RegistryAuthError(
        `${where}: the registry's Bearer challenge names a token realm that is not a URL (${JSON.stringify(realm)})`,
        401,
      );
    }
    if (tokenUrl.protocol !== 'https:' && tokenUrl.protocol !== 'http:')
      throw new RegistryAuthError(`${where}: the registry's token realm ${tokenUrl.origin} is not http(s)`, 401);
    if (challenge.params.service) tokenUrl.searchParams.set('service', challenge.params.service);
    tokenUrl.searchParams.set('scope', challenge.params.scope ?? scope);
    // The credentials are the registry's: a realm elsewhere (the challenge is the registry's word,
    // and a registry can name any URL) is asked anonymously unless its host is trusted by name.
    const send = creds && this.#trustsRealm(tokenUrl) ? creds : undefined;
    let res: Response;
    try {
      res = await fetch(tokenUrl, {
        headers: send ? { authorization: basicAuthorization(send) } : {},
        signal: AbortSignal.timeout(this.#opts.timeoutMs),
      });
    } catch (err) {
      throw new RegistryError(`${where}: cannot reach the registry's token service ${tokenUrl.origin} (${describeFetchError(err)})`);
    }
    const text = await res.text();
    if ((res.status === 401 || res.status === 403) && creds && !send) {
      throw new RegistryAuthError(
        `${where}: the registry's token service ${tokenUrl.origin} is not on the registry's host, so it was not sent the credentials of user ${JSON.stringify(creds.username)}, and it refused an anonymous token (HTTP ${res.status}); trust its host with DSEC_REGISTRY_TOKEN_HOSTS if it is the registry's`,
        res.status,
      );
    }
    if (res.status === 401 || res.status === 403) {
      throw new RegistryAuthError(
        send
          ? `${where}: the token service ${tokenUrl.origin} rejected the credentials of user ${JSON.stringify(send.username)} (HTTP ${res.status}${registryMessage(text)})`
          : `${where}: the token service ${tokenUrl.origin} requires credentials (HTTP ${res.status}); set DSEC_REGISTRY_USER and DSEC_REGISTRY_PASSWORD`,
        res.status,
      );
    }
    if (!res.ok)
      throw new RegistryError(
        `${where}: the token service ${tokenUrl.origin} answered HTTP ${res.status}${registryMessage(text)}`,
        res.status,
      );
    let token: unknown;
    try {
      const body = JSON.parse(text) as { token?: unknown; access_token?: unknown };
      token = body.token ?? body.access_token;
    } catch {
      // handled below
    }
    if (typeof token !== 'string' || token === '')
      throw new RegistryError(`${where}: the token service ${tokenUrl.origin} answered without a token`, res.status);
    this.#tokens.set(scope, `Bearer ${token}`);
  }

  /** Whether a token realm may see the credentials: on the registry's own origin, or a host of tokenHosts. */
  #trustsRealm(url: URL): boolean {
    const registry = new URL(this.ref.baseUrl);
    if (url.origin === registry.origin) return true;
    return this.#tokenHosts.includes(url.host.toLowerCase()) || this.#tokenHosts.includes(url.hostname.toLowerCase());
  }

  /** A token for the scope (a push token serves pulls too), else the Basic header, else none. */
  #authorizationFor(scope: string): string | undefined {
    return this.#tokens.get(scope) ?? (scope.endsWith(':pull') ? this.#tokens.get(`${scope},push`) : undefined) ?? this.#basic;
  }

  async #backoff(why: string, attempt: number): Promise<void> {
    this.#opts.onRetry?.(why, attempt);
    await new Promise((r) => setTimeout(r, Math.min(4000, this.#opts.backoffMs * 2 ** (attempt - 1))));
  }
}

type AuthChallengeLike = { scheme: 'basic' | 'bearer'; params: Record<string, string> };

/** `: CODE: message` from the registry's `{errors:[{code,message}]}` body, or the start of a text body. */
function registryMessage(text: string): string {
  try {
    const body = JSON.parse(text) as { errors?: { code?: string; message?: string }[] };
    if (Array.isArray(body.errors) && body.errors.length > 0)
      return `: ${body.errors.map((e) => `${e.code ?? '?'}: ${e.message ?? ''}`).join('; ')}`;
  } catch {
    // not the registry's JSON
  }
  const t = text.trim();
  return t ? `: ${t.slice(0, 200)}` : '';
}

function registryCodes(text: string): string[] {
  try {
    const body = JSON.parse(text) as { errors?: { code?: string }[] };
    return Array.isArray(body.errors) ? body.errors.map((e) => String(e.code)) : [];
  } catch {
    return [];
  }
}

/** fetch's TypeError hides the reason in `cause` (ECONNREFUSED, ECONNRESET, a TLS error). */
export function describeFetchError(err: unknown): string {
  const cause = (err as { cause?: { code?: string; message?: string } }).cause;
  if (cause?.code) return cause.code;
  return cause?.message ?? (err as Error).message;
}
