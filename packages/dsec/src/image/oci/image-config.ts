import type { ImageConfig } from '@dsec/sdk/schema';
import { openDecompressed } from './decompress.js';
import { ImportError, type SourceImage } from './import-types.js';
import { OPAQUE_MARKER, WHITEOUT_PREFIX, cleanArchivePath } from './safe-extract.js';
import { readTar } from './tar-reader.js';

// An imported image's config as dsec's ImageConfig: the OCI config's fields, the User resolved to
// numbers through the image's own /etc/passwd and /etc/group.

const DEFAULT_PATH = 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** Reads /etc/passwd and /etc/group of the merged image from its layer tars, top layer first. */
async function etcFiles(layers: SourceImage['layers']): Promise<{ passwd?: string; group?: string }> {
  const wanted = ['etc/passwd', 'etc/group'] as const;
  const out: Record<string, string | null | undefined> = {};
  for (const layer of [...layers].reverse()) {
    const deleted = new Set<string>();
    for await (const { header, body } of readTar(openDecompressed(layer.file))) {
      const rel = cleanArchivePath(header.name);
      if (rel === undefined) continue;
      const base = rel.slice(rel.lastIndexOf('/') + 1);
      const parent = rel.includes('/') ? rel.slice(0, rel.lastIndexOf('/')) : '';
      if (base === OPAQUE_MARKER) deleted.add(`${parent}/*`);
      else if (base.startsWith(WHITEOUT_PREFIX)) deleted.add(parent ? `${parent}/${base.slice(4)}` : base.slice(4));
      else if ((wanted as readonly string[]).includes(rel) && header.type === 'file' && out[rel] === undefined && header.size <= 4 << 20) {
        const chunks: Buffer[] = [];
        for await (const c of body) chunks.push(c);
        out[rel] = Buffer.concat(chunks).toString('utf8');
      }
    }
    for (const w of wanted) {
      if (out[w] === undefined && (deleted.has(w) || deleted.has('etc') || deleted.has('etc/*'))) out[w] = null;
    }
    if (wanted.every((w) => out[w] !== undefined)) break;
  }
  return { passwd: out['etc/passwd'] ?? undefined, group: out['etc/group'] ?? undefined };
}

/** An image's User as dsec's numeric `uid[:gid]`; names looked up in the image's own files. */
async function resolveUser(spec: string, layers: SourceImage['layers']): Promise<string> {
  const s = spec.trim();
  if (s === '') return '0:0';
  if (/^\d+(:\d+)?$/.test(s)) return s;
  const [userPart, groupPart] = s.split(':', 2) as [string, string | undefined];
  const etc = await etcFiles(layers);
  const lookup = (file: string | undefined, name: string): string[] | undefined =>
    file
      ?.split('\n')
      .map((l) => l.split(':'))
      .find((f) => f[0] === name && f.length >= 3);
  let uid: string;
  let gid: string | undefined;
  if (/^\d+$/.test(userPart)) uid = userPart;
  else {
    if (etc.passwd === undefined)
      throw new ImportError(
        `the image's User is ${JSON.stringify(spec)}, a name, but the image has no /etc/passwd to resolve it; use a numeric uid[:gid]`,
      );
    const f = lookup(etc.passwd, userPart);
    if (!f || !/^\d+$/.test(f[2] ?? ''))
      throw new ImportError(`the image's User ${JSON.stringify(spec)} names a user that is not in the image's /etc/passwd`);
    uid = f[2]!;
    gid = /^\d+$/.test(f[3] ?? '') ? f[3] : undefined;
  }
  if (groupPart !== undefined && groupPart !== '') {
    if (/^\d+$/.test(groupPart)) gid = groupPart;
    else {
      const f = lookup(etc.group, groupPart);
      if (!f || !/^\d+$/.test(f[2] ?? ''))
        throw new ImportError(`the image's User ${JSON.stringify(spec)} names a group that is not in the image's /etc/group`);
      gid = f[2];
    }
  }
  return gid === undefined ? uid : `${uid}:${gid}`;
}

export async function imageConfigFor(src: SourceImage): Promise<ImageConfig> {
  const c = src.config.config ?? {};
  const user = await resolveUser(c.User ?? '', src.layers);
  const env = (c.Env ?? []).filter((e): e is string => typeof e === 'string' && e.includes('='));
  if (!env.some((e) => e.startsWith('PATH='))) env.unshift(DEFAULT_PATH);
  if (!env.some((e) => e.startsWith('HOME=')) && /^0(:|$)/.test(user)) env.push('HOME=/root');
  const labels: Record<string, string> = {};
  for (const [k, v] of Object.entries(c.Labels ?? {})) if (typeof v === 'string') labels[k] = v;
  labels['dsec.import.format'] = src.format;
  labels['dsec.import.config'] = src.configDigest;
  if (src.refName) labels['dsec.import.ref'] = src.refName;
  const wd = c.WorkingDir?.trim();
  return {
    env,
    cwd: wd ? (wd.startsWith('/') ? wd : `/${wd}`) : '/',
    user,
    entrypoint: (c.Entrypoint ?? []).filter((x) => typeof x === 'string'),
    cmd: (c.Cmd ?? []).filter((x) => typeof x === 'string'),
    labels,
  };
}
