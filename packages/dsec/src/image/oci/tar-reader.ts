/**
 * A streaming tar reader (ustar, GNU and pax), written for untrusted archives: it only parses, it
 * never touches the filesystem. Long names (GNU 'L'/'K', pax path/linkpath), pax sizes, owners,
 * fractional mtimes and SCHILY.xattr.* records are applied to the entry they precede; base-256
 * numbers are read; every header checksum is checked. GNU sparse entries are refused.
 */

export type TarEntryType = 'file' | 'link' | 'symlink' | 'char' | 'block' | 'dir' | 'fifo' | 'other';

export interface TarHeader {
  /** The path as stored (after long-name records), not yet cleaned. */
  name: string;
  type: TarEntryType;
  /** The raw type flag, for messages about entries of type 'other'. */
  typeflag: string;
  mode: number;
  uid: number;
  gid: number;
  size: number;
  /** Seconds since the epoch (may be fractional with pax). */
  mtime: number;
  linkname: string;
  devmajor: number;
  devminor: number;
  /** Extended attributes from pax SCHILY.xattr.* records. */
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

const BLOCK = 512;

/** Pulls exact byte counts out of an async stream of chunks. */
class ByteReader {
  readonly #it: AsyncIterator<Buffer>;
  #bufs: Buffer[] = [];
  #len = 0;
  #eof = false;
  /** Total bytes handed out (read or skipped), for error messages. */
  offset = 0;

  constructor(source: AsyncIterable<Buffer | Uint8Array | string>) {
    const it = source[Symbol.asyncIterator]();
    this.#it = {
      next: async () => {
        const r = await it.next();
        if (r.done) return r;
        const v = r.value;
        return {
          done: false,
          value: Buffer.isBuffer(v) ? v : typeof v === 'string' ? Buffer.from(v) : Buffer.from(v.buffer, v.byteOffset, v.byteLength),
        };
      },
    };
  }

  async #fill(n: number): Promise<void> {
    while (this.#len < n && !this.#eof) {
      const r = await this.#it.next();
      if (r.done) this.#eof = true;
      else if (r.value.length) {
        this.#bufs.push(r.value);
        this.#len += r.value.length;
      }
    }
  }

  #take(n: number): Buffer {
    let out: Buffer;
    const first = this.#bufs[0]!;
    if (first.length >= n) {
      out = first.subarray(0, n);
      if (first.length === n) this.#bufs.shift();
      else this.#bufs[0] = first.subarray(n);
    } else {
      const all = Buffer.concat(this.#bufs);
      out = all.subarray(0, n);
      this.#bufs = all.length > n ? [all.subarray(n)] : [];
    }
    this.#len -= n;
    this.offset += n;
    return out;
  }

  /** Exactly n bytes, or null at a clean end of stream (no byte left); throws when cut short. */
  async read(n: number): Promise<Buffer | null> {
    await this.#fill(n);
    if (this.#len === 0 && this.#eof) return null;
    if (this.#len < n) throw new TarFormatError(`archive is truncated at byte ${this.offset + this.#len} (wanted ${n} more bytes)`);
    return this.#take(n);
  }

  /** Yields the next n bytes in pieces as they arrive. */
  async *chunks(n: number): AsyncGenerator<Buffer> {
    let left = n;
    while (left > 0) {
      if (this.#len === 0) await this.#fill(1);
      if (this.#len === 0) throw new TarFormatError(`archive is truncated at byte ${this.offset} (${left} bytes of an entry missing)`);
      const piece = this.#take(Math.min(left, this.#bufs[0]!.length));
      left -= piece.length;
      yield piece;
    }
  }

  async skip(n: number): Promise<void> {
    for await (const _ of this.chunks(n)) {
      // discard
    }
  }

  /** Drains whatever follows (padding after the end-of-archive blocks). */
  async drain(): Promise<void> {
    this.#bufs = [];
    this.#len = 0;
    while (!this.#eof) {
      const r = await this.#it.next();
      if (r.done) this.#eof = true;
    }
  }
}

function cstring(buf: Buffer, off: number, len: number): string {
  const slice = buf.subarray(off, off + len);
  const nul = slice.indexOf(0);
  return (nul === -1 ? slice : slice.subarray(0, nul)).toString('utf8');
}

/** An octal (or base-256, high bit set) numeric header field. */
function number(buf: Buffer, off: number, len: number, field: string): number {
  const first = buf[off]!;
  if (first & 0x80) {
    if (first === 0xff) throw new TarFormatError(`negative base-256 number in the ${field} field`);
    let v = first & 0x3f;
    for (let i = 1; i < len; i++) {
      v = v * 256 + buf[off + i]!;
      if (v > Number.MAX_SAFE_INTEGER) throw new TarFormatError(`the ${field} field is too large`);
    }
    return v;
  }
  const s = buf
    .subarray(off, off + len)
    .toString('latin1')
    .replace(/[\0 ]+$/, '')
    .replace(/^[ ]+/, '');
  if (s === '') return 0;
  if (!/^[0-7]+$/.test(s)) throw new TarFormatError(`bad octal number ${JSON.stringify(s)} in the ${field} field`);
  return parseInt(s, 8);
}

function checksumOk(block: Buffer): boolean {
  let stored: number;
  try {
    stored = number(block, 148, 8, 'checksum');
  } catch {
    return false;
  }
  let unsigned = 0;
  let signed = 0;
  for (let i = 0; i < BLOCK; i++) {
    const b = i >= 148 && i < 156 ? 0x20 : block[i]!;
    unsigned += b;
    signed += b > 127 ? b - 256 : b;
  }
  return stored === unsigned || stored === signed;
}

function isZeroBlock(block: Buffer): boolean {
  for (let i = 0; i < BLOCK; i++) if (block[i] !== 0) return false;
  return true;
}

/** Parses pax extended header records (`<len> <key>=<value>\n`). Values stay bytes. */
function parsePax(data: Buffer): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  let pos = 0;
  while (pos < data.length) {
    if (data[pos] === 0) break;
    const space = data.indexOf(0x20, pos);
    if (space === -1) throw new TarFormatError('malformed pax record (no length)');
    const len = Number(data.subarray(pos, space).toString('latin1'));
    if (!Number.isInteger(len) || len <= space - pos || pos + len > data.length) throw new TarFormatError('malformed pax record length');
    const record = data.subarray(space + 1, pos + len - 1); // without the trailing newline
    const eq = record.indexOf(0x3d);
    if (eq === -1) throw new TarFormatError('malformed pax record (no "=")');
    out.set(record.subarray(0, eq).toString('utf8'), record.subarray(eq + 1));
    pos += len;
  }
  return out;
}

const TYPES: Record<string, TarEntryType> = {
  '0': 'file',
  '\0': 'file',
  '7': 'file',
  '1': 'link',
  '2': 'symlink',
  '3': 'char',
  '4': 'block',
  '5': 'dir',
  '6': 'fifo',
};

/** Largest metadata entry (long name, pax header) read into memory. */
const MAX_META_BYTES = 1 << 20;

/**
 * Yields the entries of a tar stream. An entry's body must be consumed before asking for the
 * next entry, or it is skipped. Ends at the end-of-archive marker or the end of the stream.
 */
export async function* readTar(source: AsyncIterable<Buffer | Uint8Array | string>): AsyncGenerator<TarEntry> {
  const r = new ByteReader(source);
  let longName: string | undefined;
  let longLink: string | undefined;
  let pax: Map<string, Buffer> | undefined;
  let global = new Map<string, Buffer>();
  for (;;) {
    const block = await r.read(BLOCK);
    if (!block) return;
    if (isZeroBlock(block)) {
      // End of archive: two zero blocks (some writers give one). Trailing bytes are padding.
      await r.drain();
      return;
    }
    if (!checksumOk(block))
      throw new TarFormatError(`bad header checksum at byte ${r.offset - BLOCK}: not a tar archive, or a corrupt one`);
    const typeflag = String.fromCharCode(block[156]!);
    let size = number(block, 124, 12, 'size');
    const meta = typeflag === 'L' || typeflag === 'K' || typeflag === 'x' || typeflag === 'g';
    if (meta) {
      if (size > MAX_META_BYTES) throw new TarFormatError(`a ${typeflag} metadata entry of ${size} bytes is too large`);
      const data = size ? await r.read(size) : Buffer.alloc(0);
      if (size % BLOCK) await r.skip(BLOCK - (size % BLOCK));
      if (data === null) throw new TarFormatError('archive is truncated in a metadata entry');
      if (typeflag === 'L') longName = cstring(data, 0, data.length);
      else if (typeflag === 'K') longLink = cstring(data, 0, data.length);
      else if (typeflag === 'x') pax = parsePax(data);
      else global = new Map([...global, ...parsePax(data)]);
      continue;
    }
    if (typeflag === 'S') throw new TarFormatError('GNU sparse tar entries are not supported');
    const magic = block.subarray(257, 263).toString('latin1');
    let name = cstring(block, 0, 100);
    if (magic === 'ustar\0') {
      const prefix = cstring(block, 345, 155);
      if (prefix) name = `${prefix}/${name}`;
    }
    const records = new Map([...global, ...(pax ?? [])]);
    const text = (k: string): string | undefined => records.get(k)?.toString('utf8');
    const paxNum = (k: string): number | undefined => {
      const v = text(k);
      if (v === undefined) return undefined;
      const n = Number(v);
      if (!Number.isFinite(n) || n < 0) throw new TarFormatError(`bad pax ${k} value ${JSON.stringify(v)}`);
      return n;
    };
    name = text('path') ?? longName ?? name;
    const linkname = text('linkpath') ?? longLink ?? cstring(block, 157, 100);
    size = paxNum('size') ?? size;
    const xattrs = new Map<string, Buffer>();
    for (const [k, v] of records) {
      if (k.startsWith('SCHILY.xattr.')) xattrs.set(k.slice('SCHILY.xattr.'.length), v);
      if (k.startsWith('GNU.sparse.')) throw new TarFormatError('GNU sparse tar entries (pax GNU.sparse.*) are not supported');
    }
    let type = TYPES[typeflag] ?? 'other';
    // Pre-POSIX archives mark directories by a trailing slash on a regular-file entry.
    if (type === 'file' && typeflag !== '7' && name.endsWith('/') && size === 0) type = 'dir';
    const header: TarHeader = {
      name,
      type,
      typeflag,
      mode: number(block, 100, 8, 'mode'),
      uid: paxNum('uid') ?? number(block, 108, 8, 'uid'),
      gid: paxNum('gid') ?? number(block, 116, 8, 'gid'),
      size: type === 'file' || type === 'other' ? size : 0,
      mtime: paxNum('mtime') ?? number(block, 136, 12, 'mtime'),
      linkname,
      devmajor: type === 'char' || type === 'block' ? number(block, 329, 8, 'devmajor') : 0,
      devminor: type === 'char' || type === 'block' ? number(block, 337, 8, 'devminor') : 0,
      xattrs,
    };
    longName = longLink = pax = undefined;
    // Hard links and others may declare a size; data not read by the consumer is skipped.
    const dataSize = size;
    let started = false;
    let read = 0;
    const body = (async function* () {
      if (started) throw new Error('tar entry body read twice');
      started = true;
      if (header.size === 0) return;
      for await (const piece of r.chunks(header.size)) {
        read += piece.length;
        yield piece;
      }
    })();
    yield { header, body };
    if (read < dataSize) await r.skip(dataSize - read);
    if (dataSize % BLOCK) await r.skip(BLOCK - (dataSize % BLOCK));
  }
}
