/**
 * Registry authentication (the Docker/OCI token scheme, RFC 7235 challenges): a registry answers
 * 401 with `WWW-Authenticate: Basic realm=…` (htpasswd) or `Bearer realm=…,service=…,scope=…`;
 * the client answers Basic with the credentials, and Bearer by asking the realm for a token for
 * that scope (with the credentials as Basic, or anonymously), then retrying with the token.
 */

export interface RegistryCredentials {
  username: string;
  password: string;
}

export interface AuthChallenge {
  scheme: 'basic' | 'bearer';
  params: Record<string, string>;
}

/** Parses one WWW-Authenticate header value (one challenge; registries send one). */
export function parseChallenge(header: string | null): AuthChallenge | undefined {
  if (!header) return undefined;
  const m = /^\s*(\w+)\s*(.*)$/s.exec(header);
  if (!m) return undefined;
  const scheme = m[1]!.toLowerCase();
  if (scheme !== 'basic' && scheme !== 'bearer') return undefined;
  const params: Record<string, string> = {};
  const re = /([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))\s*,?/g;
  for (let p = re.exec(m[2]!); p; p = re.exec(m[2]!)) params[p[1]!.toLowerCase()] = (p[2] ?? p[3] ?? '').replace(/\\(.)/g, '$1');
  return { scheme, params };
}

export function basicAuthorization(creds: RegistryCredentials): string {
  return `Basic ${Buffer.from(`${creds.username}:${creds.password}`).toString('base64')}`;
}

/**
 * Credentials from the environment: DSEC_REGISTRY_USER and DSEC_REGISTRY_PASSWORD (or
 * DSEC_REGISTRY_PASSWORD_FILE, for a mounted secret). Undefined when no user is set.
 */
export function credentialsFromEnv(env: NodeJS.ProcessEnv = process.env, readFile: (p: string) => string): RegistryCredentials | undefined {
  const username = env.DSEC_REGISTRY_USER;
  if (!username) return undefined;
  const file = env.DSEC_REGISTRY_PASSWORD_FILE;
  const password = file ? readFile(file).replace(/\r?\n$/, '') : (env.DSEC_REGISTRY_PASSWORD ?? '');
  return { username, password };
}
