/**
 * A minimal ustar encoder and decoder for the engine tests: enough to build hostile archives
 * (symlinks followed by files "through" them, `..` and absolute names) and to inspect what the
 * sandbox's tar produced (names, types, modes, contents).
 */

export type TarEntryType = 'file' | 'dir' | 'symlink';

export interface TarEntry {
  name: string;
  type: TarEntryType;
  /** Permission bits, e.g. 0o644. */
  mode: number;
  data?: Buffer | string;
  /** Target of a symlink. */
  linkname?: string;
}

const BLOCK = 512;

function writeString(buf: Buffer, s: string, off: number, len: number): void {
  const b = Buffer.from(s, 'utf8');
  if (b.length > len) throw new Error(`tar field too long (${b.length} > ${len}): ${s}`);
  b.copy(buf, off);
}

function writeOctal(buf: Buffer, n: number, off: number, len: number): void {
  writeString(buf, n.toString(8).padStart(len - 1, '0'), off, len - 1);
  buf[off + len - 1] = 0;
}

function header(e: TarEntry, size: number): Buffer {
  const h = Buffer.alloc(BLOCK);
  let name = e.name;
  let prefix = '';
  if (Buffer.byteLength(name) > 100) {
    const cut = name.lastIndexOf('/', 154);
    if (cut <= 0) throw new Error(`tar name too long for ustar: ${name}`);
    prefix = name.slice(0, cut);
    name = name.slice(cut + 1);
  }
  writeString(h, name, 0, 100);
  writeOctal(h, e.mode & 0o7777, 100, 8);
  writeOctal(h, 0, 108, 8); // uid
  writeOctal(h, 0, 116, 8); // gid
  writeOctal(h, size, 124, 12);
  writeOctal(h, 1_700_000_000, 136, 12); // mtime: fixed, so archives are reproducible
  h.fill(0x20, 148, 156); // checksum is computed with its own field as spaces
  h[156] = (e.type === 'file' ? '0' : e.type === 'dir' ? '5' : '2').charCodeAt(0);
  if (e.linkname !== undefined) writeString(h, e.linkname, 157, 100);
  writeString(h, 'ustar\0', 257, 6);
  writeString(h, '00', 263, 2);
  writeString(h, 'root', 265, 32);
  writeString(h, 'root', 297, 32);
  writeString(h, prefix, 345, 155);
  let sum = 0;
  for (const byte of h) sum += byte;
  writeString(h, sum.toString(8).padStart(6, '0'), 148, 6);
  h[154] = 0;
  h[155] = 0x20;
  return h;
}

/** Encodes entries, in order, as a ustar archive (with the two zero blocks at the end). */
export function encodeTar(entries: TarEntry[]): Buffer {
  const parts: Buffer[] = [];
  for (const e of entries) {
    const data = e.type === 'file' ? Buffer.from(e.data ?? '') : Buffer.alloc(0);
    parts.push(header(e, data.length));
    if (data.length) {
      parts.push(data);
      const pad = (BLOCK - (data.length % BLOCK)) % BLOCK;
      if (pad) parts.push(Buffer.alloc(pad));
    }
  }
  parts.push(Buffer.alloc(2 * BLOCK));
  return Buffer.concat(parts);
}

export interface ParsedTarEntry {
  name: string;
  type: TarEntryType | 'other';
  mode: number;
  size: number;
  data: Buffer;
  linkname: string;
}

function readString(buf: Buffer, off: number, len: number): string {
  const field = buf.subarray(off, off + len);
  const nul = field.indexOf(0);
  return field.subarray(0, nul < 0 ? len : nul).toString('utf8');
}

function readOctal(buf: Buffer, off: number, len: number): number {
  const s = readString(buf, off, len).trim();
  return s ? parseInt(s, 8) : 0;
}

/** Decodes a ustar/GNU archive: handles the ustar prefix, GNU long names ('L') and pax path/linkpath. */
export function parseTar(buf: Buffer): ParsedTarEntry[] {
  const out: ParsedTarEntry[] = [];
  let off = 0;
  let longName: string | undefined;
  let longLink: string | undefined;
  while (off + BLOCK <= buf.length) {
    const h = buf.subarray(off, off + BLOCK);
    if (h.every((b) => b === 0)) break;
    const size = readOctal(h, 124, 12);
    const flag = String.fromCharCode(h[156]!);
    const data = buf.subarray(off + BLOCK, off + BLOCK + size);
    off += BLOCK + Math.ceil(size / BLOCK) * BLOCK;
    if (flag === 'L') {
      longName = data.toString('utf8').replace(/\0+$/, '');
      continue;
    }
    if (flag === 'K') {
      longLink = data.toString('utf8').replace(/\0+$/, '');
      continue;
    }
    if (flag === 'x') {
      for (const rec of data.toString('utf8').split('\n')) {
        const m = /^\d+ (path|linkpath)=(.*)$/.exec(rec);
        if (m?.[1] === 'path') longName = m[2];
        if (m?.[1] === 'linkpath') longLink = m[2];
      }
      continue;
    }
    if (flag === 'g') continue;
    const prefix = readString(h, 345, 155);
    let name = readString(h, 0, 100);
    if (prefix) name = `${prefix}/${name}`;
    if (longName !== undefined) name = longName;
    const linkname = longLink ?? readString(h, 157, 100);
    longName = undefined;
    longLink = undefined;
    const type = flag === '0' || flag === '\0' || flag === '7' ? 'file' : flag === '5' ? 'dir' : flag === '2' ? 'symlink' : 'other';
    out.push({ name, type, mode: readOctal(h, 100, 8) & 0o7777, size, data: Buffer.from(data), linkname });
  }
  return out;
}
