/**
 * A reference to an image in an OCI registry: `[http[s]://]host[:port]/repo/path[:tag][@sha256:…]`,
 * as `dsec image push|pull REF` and `--registry` take it. The host part always has a dot, a colon
 * or is `localhost` (there is no default registry: dsec never guesses one on the internet).
 */
export interface RegistryRef {
  /** `https://host:port` (no trailing slash). */
  baseUrl: string;
  /** `host:port`, as shown to the user. */
  host: string;
  /** The repository name, e.g. `team/busybox`. */
  repository: string;
  /** The tag, when one was given (or `latest` when neither a tag nor a digest was). */
  tag?: string;
  /** `sha256:<hex>` when the reference pins a manifest digest. */
  digest?: string;
}

const REPO_COMPONENT = /^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*$/;
const TAG = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
const DIGEST = /^sha256:[0-9a-f]{64}$/;

export class RegistryRefError extends Error {
  override readonly name = 'RegistryRefError';
}

/** Loopback hosts speak plain HTTP unless `https://` is written, as Docker treats localhost. */
function isLoopbackHost(host: string): boolean {
  const name = host.replace(/:\d+$/, '').replace(/^\[|\]$/g, '');
  return name === 'localhost' || name === '::1' || /^127\.\d+\.\d+\.\d+$/.test(name);
}

/**
 * Parses REF. `requireName` false accepts a bare repository prefix (`--registry host/prefix`), where
 * a tag or digest makes no sense.
 */
export function parseRegistryRef(input: string, opts: { requireName?: boolean } = {}): RegistryRef {
  const requireName = opts.requireName ?? true;
  const bad = (why: string): never => {
    throw new RegistryRefError(
      `registry reference ${JSON.stringify(input)}: ${why} (expected [https://]HOST[:PORT]/REPOSITORY[:TAG][@sha256:DIGEST])`,
    );
  };
  let rest = input.trim();
  let scheme: 'http' | 'https' | undefined;
  const m = /^(https?):\/\//.exec(rest);
  if (m) {
    scheme = m[1] as 'http' | 'https';
    rest = rest.slice(m[0].length);
  }
  const slash = rest.indexOf('/');
  if (slash <= 0) return bad('no registry host');
  const host = rest.slice(0, slash);
  if (
    !/^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?$/.test(host) ||
    !(host.includes('.') || host.includes(':') || host === 'localhost')
  ) {
    return bad(`${JSON.stringify(host)} is not a registry host (it needs a dot or a port, or is localhost)`);
  }
  let path = rest.slice(slash + 1);
  let digest: string | undefined;
  const at = path.indexOf('@');
  if (at >= 0) {
    digest = path.slice(at + 1);
    path = path.slice(0, at);
    if (!DIGEST.test(digest)) return bad(`digest ${JSON.stringify(digest)} is not sha256:<64 hex>`);
  }
  let tag: string | undefined;
  const colon = path.lastIndexOf(':');
  if (colon >= 0) {
    tag = path.slice(colon + 1);
    path = path.slice(0, colon);
    if (!TAG.test(tag)) return bad(`tag ${JSON.stringify(tag)} is not a valid tag`);
  }
  path = path.replace(/\/+$/, '');
  if (path === '') return bad('no repository');
  if (path.split('/').some((c) => !REPO_COMPONENT.test(c)))
    return bad(`repository ${JSON.stringify(path)} must be lowercase letters, digits and separators`);
  if (!requireName && (tag !== undefined || digest !== undefined)) return bad('a registry prefix takes no tag or digest');
  if (requireName && tag === undefined && digest === undefined) tag = 'latest';
  const baseUrl = `${scheme ?? (isLoopbackHost(host) ? 'http' : 'https')}://${host}`;
  return { baseUrl, host, repository: path, ...(tag !== undefined ? { tag } : {}), ...(digest !== undefined ? { digest } : {}) };
}

/** The reference as `host/repo[:tag][@digest]`. */
export function formatRegistryRef(ref: RegistryRef): string {
  return `${ref.host}/${ref.repository}${ref.tag !== undefined ? `:${ref.tag}` : ''}${ref.digest !== undefined ? `@${ref.digest}` : ''}`;
}
