import { type DockerfileBuild, stateKey } from './build-state.js';
import { DockerfileError } from './parser.js';
import { withSandbox } from './sandbox-steps.js';

const isNumericUser = (s: string): boolean => /^\d+(:\d+)?$/.test(s);

/** /etc/passwd and /etc/group of the current state, read from a sandbox. */
async function etcFiles(b: DockerfileBuild): Promise<{ passwd?: string; group?: string }> {
  const key = stateKey(b.stage!.layers, { ...b.stage!.config, user: '0:0' });
  if (b.etcCache?.key !== key) {
    const [passwd, group] = await withSandbox(b, true, async (id) =>
      Promise.all([b.sandboxes.readFile(id, '/etc/passwd'), b.sandboxes.readFile(id, '/etc/group')]),
    );
    b.etcCache = { key, passwd: passwd?.toString('utf8'), group: group?.toString('utf8') };
  }
  return b.etcCache;
}

const lookup = (file: string | undefined, name: string): string[] | undefined =>
  file
    ?.split('\n')
    .map((l) => l.split(':'))
    .find((f) => f[0] === name && f.length >= 3 && /^\d+$/.test(f[2] ?? ''));

/** `user[:group]` with names → numeric `uid[:gid]` via the image's own files. */
export async function resolveUser(b: DockerfileBuild, spec: string, line: number): Promise<string> {
  if (isNumericUser(spec)) return spec;
  const [u, g] = spec.split(':', 2) as [string, string | undefined];
  const etc = await etcFiles(b);
  let uid = u;
  let gid: string | undefined;
  if (!/^\d+$/.test(u)) {
    const f = lookup(etc.passwd, u);
    if (!f)
      throw new DockerfileError(
        `user ${JSON.stringify(u)} is not in the image's /etc/passwd${etc.passwd === undefined ? ' (the image has none)' : ''}; use a numeric uid`,
        line,
      );
    uid = f[2]!;
    gid = /^\d+$/.test(f[3] ?? '') ? f[3] : undefined;
  }
  if (g) {
    if (/^\d+$/.test(g)) gid = g;
    else {
      const f = lookup(etc.group, g);
      if (!f) throw new DockerfileError(`group ${JSON.stringify(g)} is not in the image's /etc/group; use a numeric gid`, line);
      gid = f[2];
    }
  }
  return gid === undefined ? uid : `${uid}:${gid}`;
}
