import { posix } from 'node:path';
import { readTar } from '../oci/tar-reader.js';
import { tarArchive, type TarWriteEntry } from '../oci/tar-writer.js';
import type { DockerfileBuild, StageImage } from './build-state.js';
import { DockerfileError } from './parser.js';
import { withSandbox } from './sandbox-steps.js';

/** What one `COPY --from` puts into the step's sandbox: an archive to unpack in `dir`. */
export interface CopyFromArchive {
  dir: string;
  tar: Buffer;
  entries: number;
  bytes: number;
}

/**
 * `COPY --from=STAGE SRC… DEST`: the sources are read from a sandbox of the earlier stage (or
 * image) as tar archives, their entries renamed to where Docker puts them, and packed as one
 * archive to unpack at the destination, owned by root (or --chown) with --chmod applied.
 *
 * Where Docker puts them: a directory's contents go into DEST; a file goes to DEST/its name when
 * DEST ends with '/' (or is a directory already, or there are several sources), else to DEST
 * itself. Wildcards in the sources are not matched (they are refused with a message).
 *
 * The source sandbox runs as root, so every file of the stage is readable, and is killed at once.
 */
export async function archiveFromStage(
  b: DockerfileBuild,
  source: StageImage,
  sources: string[],
  dest: string,
  destIsDir: boolean,
  owner: { uid: number; gid: number; chmod: number | undefined },
  line: number,
): Promise<CopyFromArchive> {
  for (const src of sources)
    if (/[*?[]/.test(src))
      throw new DockerfileError(`COPY --from ${src}: wildcards are not supported in --from sources; name the paths`, line);
  const intoDir = destIsDir || dest.endsWith('/') || sources.length > 1;
  const dir = intoDir ? dest.replace(/\/+$/, '') || '/' : posix.dirname(dest);
  const entries: TarWriteEntry[] = [];
  let bytes = 0;
  await withSandbox(
    b,
    true,
    async (id) => {
      for (const src of sources) {
        const abs = posix.resolve('/', src);
        const kind = await b.sandboxes.stat(id, abs);
        if (kind === undefined) throw new DockerfileError(`COPY --from: ${src} does not exist in the source stage`, line);
        // The archive's one top-level entry is the source's base name: rename it to its place.
        const top = abs === '/' ? '.' : posix.basename(abs);
        const placed = kind === 'dir' ? '.' : intoDir ? top : posix.basename(dest);
        const rename = (name: string): string | undefined => {
          const clean = name.replace(/^\.\//, '').replace(/\/+$/, '');
          if (clean === top) return placed;
          if (!clean.startsWith(`${top}/`)) return undefined; // not under the source (tar never writes one)
          return posix.join(placed, clean.slice(top.length + 1));
        };
        for await (const e of readTar(await b.sandboxes.downloadTar(id, abs))) {
          const h = e.header;
          const name = rename(h.name);
          if (name === undefined || name === '.') continue; // the destination directory itself: it is made, not copied
          if (h.type !== 'file' && h.type !== 'dir' && h.type !== 'symlink' && h.type !== 'link') {
            b.warn(`COPY --from: ${h.name} is a ${h.type} node; not copied`);
            continue;
          }
          const chunks: Buffer[] = [];
          for await (const c of e.body) chunks.push(c);
          const data = Buffer.concat(chunks);
          bytes += data.length;
          const linkname = h.type === 'link' ? rename(h.linkname) : h.linkname;
          if (h.type === 'link' && linkname === undefined) continue;
          entries.push({
            name,
            type: h.type,
            mode: owner.chmod ?? h.mode,
            uid: owner.uid,
            gid: owner.gid,
            mtime: h.mtime,
            data,
            linkname,
          });
        }
      }
    },
    source,
  );
  return { dir, tar: tarArchive(entries), entries: entries.length, bytes };
}
