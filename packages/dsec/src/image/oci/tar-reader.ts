import { type Header, extract } from 'tar-stream';

/**
 * Reads tar streams with tar-stream (the streaming parser behind tar-fs, 200M+ downloads a
 * month): header checksums, ustar prefixes, GNU long names and links ('L'/'K'), pax records
 * (path, linkpath, size), base-256 numbers and backpressure are the library's. It only parses;
 * it never touches the filesystem (safe-extract.ts decides what an entry may do).
 *
 * What this module adds, because archives from users and registries are untrusted:
 * - every numeric field is checked (tar-stream hands over NaN for a field that is not octal and a
 *   negative number for a negative base-256 one; an owner of NaN must not reach lchown);
 * - pax uid, gid and mtime records are applied (tar-stream applies path, linkpath and size only);
 * - extended attributes (SCHILY.xattr.*) are read byte-exact from the pax record bytes, since
 *   tar-stream decodes every pax value as UTF-8 text: a binary value such as security.capability
 *   (cap_sys_nice's bit is the byte 0x80) would come back with U+FFFD in place of its bytes;
 * - entries of a type tar-stream does not know (GNU sparse 'S', volume labels, multi-volume
 *   parts) are refused: the data of a sparse file is not its content, and skipping it would
 *   import an image that silently lacks a file;
 * - tar-stream's errors become TarFormatError with a message that says what is wrong.
 *
 * Left as tar-stream does it: zero blocks are skipped rather than ending the archive (entries of a
 * second archive appended after the end marker are read, as `tar --ignore-zeros` does; other bytes
 * there are a format error), and pax global records (`g`) reach only entries that have a pax
 * header of their own. Neither lets an entry escape: every name still goes through safe-extract.
 */

export type TarEntryType = 'file' | 'link' | 'symlink' | 'char' | 'block' | 'dir' | 'fifo';

export interface TarHeader {
  /** The path as stored (after long-name records), not yet cleaned. */
  name: string;
  type: TarEntryType;
  mode: number;
  uid: number;
  gid: number;
  size: number;
  /** Seconds since the epoch (may be fractional with pax). */
  mtime: number;
  linkname: string;
  devmajor: number;
  devminor: number;
  /** Extended attributes from pax SCHILY.xattr.* records, byte-exact. */
  xattrs: Map<string, Buffer>;
}

export interface TarEntry {
  header: TarHeader;
  /** The entry's data; read it or leave it (it is skipped when the next entry is requested). */
  body: AsyncIterable<Buffer>;
}

export class TarFormatError extends Error {
  override readonly name = 'TarFormatError';
}

const TYPES: Partial<Record<string, TarEntryType>> = {
  file: 'file',
  'contiguous-file': 'file',
  link: 'link',
  symlink: 'symlink',
  'character-device': 'char',
  'block-device': 'block',
  directory: 'dir',
  fifo: 'fifo',
};

/** What tar-stream's own errors mean, in words a user can act on. */
function formatError(err: unknown, after: string): unknown {
  const message = err instanceof Error ? err.message : '';
  const where = after ? ` (after the entry ${JSON.stringify(after)})` : ' (in the first header)';
  if (/^Invalid tar header/.test(message)) return new TarFormatError(`bad header checksum${where}: not a tar archive, or a corrupt one`);
  if (message === 'Unexpected end of data') return new TarFormatError(`archive is truncated${where}`);
  if (message === 'Header exceeds max size')
    return new TarFormatError(`a long-name or pax metadata entry is too large (over 4 MiB)${where}`);
  if (message === 'Invalid header') return new TarFormatError(`an entry has a negative or unreadable size${where}`);
  return err;
}

/** `<length> <key>=<value>\n` records, values kept as bytes. */
function paxRecords(data: Buffer): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  let pos = 0;
  while (pos < data.length && data[pos] !== 0) {
    const space = data.indexOf(0x20, pos);
    const len = space === -1 ? NaN : Number(data.subarray(pos, space).toString('latin1'));
    if (!Number.isInteger(len) || len <= space - pos || pos + len > data.length) throw new TarFormatError('malformed pax record length');
    const record = data.subarray(space + 1, pos + len - 1);
    const eq = record.indexOf(0x3d);
    if (eq === -1) throw new TarFormatError('malformed pax record (no "=")');
    out.set(record.subarray(0, eq).toString('utf8'), record.subarray(eq + 1));
    pos += len;
  }
  return out;
}

/** The parts of tar-stream's Extract this module hooks into (see rawPaxOf). */
interface ExtractInternals {
  _decodeLongHeader: (this: ExtractInternals, buf: Buffer) => void;
  _header: { type: string } | null;
  _pax: object | null;
}

/**
 * Keeps the bytes of each pax header beside the record object tar-stream makes of it (the object
 * it then hands over as `header.pax`), so xattr values can be read byte-exact. tar-stream's
 * version is pinned by package-lock.json; the "binary xattr values" test fails if its internals
 * move, and this throws rather than read xattrs lossily.
 */
function keepRawPax(ex: object, raw: WeakMap<object, Buffer>): void {
  const internals = ex as ExtractInternals;
  const decode = internals._decodeLongHeader;
  if (typeof decode !== 'function') throw new Error('tar-stream no longer has Extract._decodeLongHeader: see keepRawPax in tar-reader.ts');
  internals._decodeLongHeader = function (this: ExtractInternals, buf: Buffer) {
    decode.call(this, buf);
    if (this._header?.type === 'pax-header' && this._pax) raw.set(this._pax, Buffer.from(buf));
  };
}

function checkedNumber(v: number, field: string, name: string): number {
  // tar-stream reads a negative base-256 number as a negative (all 0xff bytes: as -0).
  if (!Number.isSafeInteger(v) || v < 0 || Object.is(v, -0))
    throw new TarFormatError(`the ${field} field of ${JSON.stringify(name)} is not a valid number`);
  return v;
}

function paxNumber(pax: Record<string, string> | undefined, key: string, name: string, fraction = false): number | undefined {
  const v = pax?.[key];
  if (v === undefined) return undefined;
  if (!(fraction ? /^\d+(\.\d+)?$/ : /^\d+$/).test(v) || !Number.isSafeInteger(Math.floor(Number(v))))
    throw new TarFormatError(`bad pax ${key} value ${JSON.stringify(v)} for ${JSON.stringify(name)}`);
  return Number(v);
}

function toHeader(h: Header, raw: Buffer | undefined): TarHeader {
  const name = h.name;
  const pax = (h.pax ?? undefined) as Record<string, string> | undefined;
  const paxKeys = pax ? Object.keys(pax) : [];
  const type = TYPES[h.type as string];
  if (!type) {
    const sparse = paxKeys.some((k) => k.startsWith('GNU.sparse.'));
    throw new TarFormatError(
      `${JSON.stringify(name)} is a ${sparse ? 'GNU sparse entry' : 'tar entry of a type dsec does not read (GNU sparse, volume label or multi-volume part)'}: repack the archive without it`,
    );
  }
  if (paxKeys.some((k) => k.startsWith('GNU.sparse.')))
    throw new TarFormatError(`${JSON.stringify(name)} is a GNU sparse entry (pax GNU.sparse.*): repack the archive without sparse files`);
  // tar-stream framed the entry with parseInt of a pax size ('12abc' reads as 12): refuse such a value.
  paxNumber(pax, 'size', name);
  const xattrs = new Map<string, Buffer>();
  // The record bytes are parsed for every pax header: tar-stream passes a malformed record over in silence.
  if (raw) for (const [k, v] of paxRecords(raw)) if (k.startsWith('SCHILY.xattr.')) xattrs.set(k.slice('SCHILY.xattr.'.length), v);
  const device = type === 'char' || type === 'block';
  return {
    name,
    type,
    mode: checkedNumber(h.mode, 'mode', name),
    uid: paxNumber(pax, 'uid', name) ?? checkedNumber(h.uid, 'uid', name),
    gid: paxNumber(pax, 'gid', name) ?? checkedNumber(h.gid, 'gid', name),
    // The size tar-stream framed the entry with (pax size included); data of non-files is skipped.
    size: type === 'file' ? checkedNumber(h.size, 'size', name) : 0,
    mtime: paxNumber(pax, 'mtime', name, true) ?? checkedNumber(h.mtime.getTime() / 1000, 'mtime', name),
    linkname: h.linkname ?? '',
    devmajor: device ? checkedNumber(h.devmajor, 'devmajor', name) : 0,
    devminor: device ? checkedNumber(h.devminor, 'devminor', name) : 0,
    xattrs,
  };
}

function asBuffer(v: Buffer | Uint8Array | string): Buffer {
  return Buffer.isBuffer(v) ? v : typeof v === 'string' ? Buffer.from(v) : Buffer.from(v.buffer, v.byteOffset, v.byteLength);
}

/**
 * Yields the entries of a tar stream. An entry's body must be consumed before asking for the
 * next entry, or it is skipped. Ends at the end of the stream (zero blocks are skipped).
 */
export async function* readTar(source: AsyncIterable<Buffer | Uint8Array | string>): AsyncGenerator<TarEntry> {
  // Archives from `tar --format=v7` and other pre-ustar writers have no magic; they are still tar.
  const ex = extract({ allowUnknownFormat: true } as Parameters<typeof extract>[0]);
  const rawPax = new WeakMap<object, Buffer>();
  keepRawPax(ex, rawPax);
  const settled = (): Promise<void> =>
    new Promise((resolve) => {
      const done = (): void => {
        ex.off('drain', done);
        ex.off('close', done);
        resolve();
      };
      ex.on('drain', done);
      ex.on('close', done);
    });
  // Feeds the parser with backpressure; a source error ends the parse with that error.
  const input = source[Symbol.asyncIterator]();
  const pump = (async () => {
    try {
      for (let r = await input.next(); !r.done; r = await input.next()) {
        if (ex.destroyed) return;
        if (!ex.write(asBuffer(r.value))) await settled();
      }
      if (!ex.destroyed) ex.end(null);
    } catch (err) {
      ex.destroy(err as Error);
    }
  })();
  const entries = ex[Symbol.asyncIterator]();
  let last = '';
  let finished = false;
  /** Awaits a step of the parser, with tar-stream's errors turned into TarFormatErrors. */
  const step = async <T>(p: Promise<T>): Promise<T> => {
    try {
      return await p;
    } catch (err) {
      throw formatError(err, last);
    }
  };
  try {
    for (;;) {
      const next = await step(entries.next());
      if (next.done) break;
      const stream = next.value;
      const header = toHeader(stream.header, stream.header.pax ? rawPax.get(stream.header.pax) : undefined);
      last = header.name;
      const chunks = stream[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
      let started = false;
      let ended = stream.header.size === 0;
      // Reads the data through the stream's iterator without ever calling its return(): ending an
      // entry stream early would destroy the whole parser, and the rest is drained below instead.
      const body = (async function* () {
        if (started) throw new Error('tar entry body read twice');
        started = true;
        if (header.size === 0) return;
        try {
          for (let r = await chunks.next(); !r.done; r = await chunks.next()) yield r.value;
        } catch (err) {
          throw formatError(err, last);
        }
        ended = true;
      })();
      yield { header, body };
      if (!ended) {
        try {
          for (let r = await chunks.next(); !r.done; r = await chunks.next()) {
            // skip what the consumer did not read
          }
        } catch (err) {
          throw formatError(err, last);
        }
      }
    }
    finished = true;
  } finally {
    if (!ex.destroyed) ex.destroy(null);
    if (finished) await pump;
    // Stopped early (an error, or a consumer that had enough): the source is closed, not drained.
    else void input.return?.().catch(() => {});
  }
}
