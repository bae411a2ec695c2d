import { createHash } from 'node:crypto';
import { existsSync, lstatSync, readFileSync, readdirSync, readlinkSync, realpathSync, statSync } from 'node:fs';
import { basename, join, posix } from 'node:path';
import { cleanArchivePath } from '../oci/safe-extract.js';
import { type TarWriteEntry, tarArchive } from '../oci/tar-writer.js';
import { DockerfileError } from './parser.js';

/** A glob (`*`, `?`, `**`, `[…]`) as an anchored regular expression over a relative path. */
export function globToRegExp(glob: string): RegExp {
  let re = '';
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i]!;
    if (c === '*') {
      if (glob[i + 1] === '*') {
        re += '.*';
        i++;
        if (glob[i + 1] === '/') i++;
      } else re += '[^/]*';
    } else if (c === '?') re += '[^/]';
    else if (c === '[') {
      const end = glob.indexOf(']', i + 1);
      if (end === -1) re += '\\[';
      else {
        re += `[${glob
          .slice(i + 1, end)
          .replace(/^!/, '^')
          .replace(/\\/g, '\\\\')}]`;
        i = end;
      }
    } else re += c.replace(/[.+^${}()|\\]/g, '\\$&');
  }
  return new RegExp(`^${re}$`);
}

const hasGlob = (s: string): boolean => /[*?[]/.test(s);

/** .dockerignore: paths of the context left out of COPY/ADD (`!` re-includes; last match wins). */
export class IgnoreRules {
  readonly #rules: { re: RegExp; negate: boolean }[] = [];

  constructor(text = '') {
    for (const raw of text.split('\n')) {
      const line = raw.trim();
      if (!line || line.startsWith('#')) continue;
      const negate = line.startsWith('!');
      const clean = cleanArchivePath(negate ? line.slice(1).trim() : line);
      if (!clean) continue;
      this.#rules.push({ re: globToRegExp(clean), negate });
    }
  }

  static load(contextDir: string): IgnoreRules {
    const f = join(contextDir, '.dockerignore');
    return new IgnoreRules(existsSync(f) ? readFileSync(f, 'utf8') : '');
  }

  /** Whether a relative path (or one of its parents) is ignored. */
  ignores(rel: string): boolean {
    let ignored = false;
    const parts = rel.split('/');
    for (const r of this.#rules) {
      for (let n = 1; n <= parts.length; n++) {
        if (r.re.test(parts.slice(0, n).join('/'))) {
          ignored = !r.negate;
          break;
        }
      }
    }
    return ignored;
  }
}

export interface PreparedCopy {
  /** The archive to unpack into `dir` inside the sandbox. */
  tar: Buffer;
  dir: string;
  /** sha256 of names, types, modes, owners, link targets and contents (not mtimes): the cache input. */
  hash: string;
  files: number;
  bytes: number;
}

export interface CopyOptions {
  contextDir: string;
  sources: string[];
  /** Absolute destination inside the image. */
  dest: string;
  /** The destination already exists as a directory in the image (files then go inside it). */
  destIsExistingDir: boolean;
  uid: number;
  gid: number;
  chmod?: number;
  ignore: IgnoreRules;
  line: number;
  /** Heredoc sources (`<<EOF` → its content): files made from the Dockerfile, not the context. */
  inline?: ReadonlyMap<string, { name: string; data: Buffer }>;
}

/** Resolves COPY sources in the context and packs them as a tar for the destination. */
export function prepareCopy(o: CopyOptions): PreparedCopy {
  const realContext = realpathSync(o.contextDir);
  const matches: { rel: string; abs: string }[] = [];
  const inline: { name: string; data: Buffer }[] = [];
  for (const src of o.sources) {
    const doc = o.inline?.get(src);
    if (doc) {
      inline.push(doc);
      continue;
    }
    if (/^[a-z][a-z0-9+.-]*:\/\//i.test(src))
      throw new DockerfileError(`COPY/ADD from a URL (${src}) is not supported: only files of the build context`, o.line);
    const clean = cleanArchivePath(src);
    if (clean === undefined) throw new DockerfileError(`${src} is outside the build context`, o.line);
    const found: string[] = [];
    if (hasGlob(clean)) {
      const dirRel = clean.includes('/') ? clean.slice(0, clean.lastIndexOf('/')) : '';
      if (hasGlob(dirRel)) throw new DockerfileError(`wildcards are supported in the last part of a COPY source only (${src})`, o.line);
      const re = globToRegExp(basename(clean));
      const dirAbs = join(realContext, dirRel);
      if (existsSync(dirAbs))
        for (const name of readdirSync(dirAbs).sort()) if (re.test(name)) found.push(dirRel ? `${dirRel}/${name}` : name);
    } else found.push(clean);
    const usable = found.filter((rel) => rel === '' || !o.ignore.ignores(rel));
    if (usable.length === 0)
      throw new DockerfileError(
        `COPY source ${src} matches no file in the build context${found.length ? ' (it is in .dockerignore)' : ''}`,
        o.line,
      );
    for (const rel of usable) {
      const abs = join(realContext, rel);
      if (!existsSync(abs)) throw new DockerfileError(`COPY source ${src} not found in the build context`, o.line);
      const real = realpathSync(abs);
      if (real !== realContext && !real.startsWith(`${realContext}/`))
        throw new DockerfileError(`COPY source ${src} is a symlink leading outside the build context`, o.line);
      matches.push({ rel, abs: real });
    }
  }
  const sourceCount = matches.length + inline.length;
  const intoDir = o.dest.endsWith('/') || o.destIsExistingDir || sourceCount > 1 || matches.some((m) => statSync(m.abs).isDirectory());
  if (sourceCount > 1 && !o.dest.endsWith('/') && !o.destIsExistingDir) {
    throw new DockerfileError(`COPY with several sources needs a destination directory ending in / (${o.dest})`, o.line);
  }
  const destClean = posix.normalize(o.dest);
  const dir = intoDir ? destClean.replace(/\/+$/, '') || '/' : posix.dirname(destClean);
  const entries: TarWriteEntry[] = [];
  const hash = createHash('sha256');
  let bytes = 0;
  const add = (e: TarWriteEntry): void => {
    entries.push(e);
    const content = e.data ? createHash('sha256').update(e.data).digest('hex') : '';
    hash.update(JSON.stringify([e.name, e.type, e.mode, e.uid, e.gid, e.linkname ?? '', content]) + '\n');
    bytes += e.data?.length ?? 0;
  };
  const meta = (mode: number, mtime: number): Pick<TarWriteEntry, 'mode' | 'uid' | 'gid' | 'mtime'> => ({
    mode: o.chmod ?? mode & 0o7777,
    uid: o.uid,
    gid: o.gid,
    mtime: Math.floor(mtime / 1000),
  });
  const walk = (absDir: string, relInContext: string, nameInTar: string): void => {
    for (const name of readdirSync(absDir).sort()) {
      const rel = relInContext ? `${relInContext}/${name}` : name;
      if (o.ignore.ignores(rel)) continue;
      const abs = join(absDir, name);
      const st = lstatSync(abs);
      const tarName = nameInTar ? `${nameInTar}/${name}` : name;
      if (st.isDirectory()) {
        add({ name: tarName, type: 'dir', ...meta(st.mode, st.mtimeMs) });
        walk(abs, rel, tarName);
      } else if (st.isFile()) add({ name: tarName, type: 'file', data: readFileSync(abs), ...meta(st.mode, st.mtimeMs) });
      else if (st.isSymbolicLink())
        add({ name: tarName, type: 'symlink', linkname: readlinkSync(abs), ...meta(0o777, st.mtimeMs), mode: 0o777 });
      // sockets, FIFOs and devices are not copied
    }
  };
  for (const m of matches) {
    const st = statSync(m.abs);
    if (st.isDirectory()) walk(m.abs, m.rel, '');
    else if (st.isFile())
      add({
        name: intoDir ? basename(m.rel) : posix.basename(destClean),
        type: 'file',
        data: readFileSync(m.abs),
        ...meta(st.mode, st.mtimeMs),
      });
    else throw new DockerfileError(`COPY source ${m.rel} is not a file or directory`, o.line);
  }
  for (const doc of inline)
    add({
      name: intoDir ? doc.name : posix.basename(destClean),
      type: 'file',
      data: doc.data,
      mode: o.chmod ?? 0o644,
      uid: o.uid,
      gid: o.gid,
      mtime: 0,
    });
  hash.update(JSON.stringify({ dir, chmod: o.chmod ?? null }));
  return { tar: tarArchive(entries), dir, hash: hash.digest('hex'), files: entries.length, bytes };
}
