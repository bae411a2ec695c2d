/**
 * A small tar writer (ustar, with a pax header when a name, link name, size or id does not fit),
 * for sending files into a sandbox (Dockerfile COPY). Names are stored as given (relative).
 *
 * Why not tar-stream's packer (tar-stream reads every archive dsec imports): its callers need the
 * archive synchronously (prepareCopy hashes it into a build-cache key; tests build hostile
 * archives inline), and tar-stream's pack is a stream that opens on the next tick, so no
 * synchronous use is possible. It also writes no pax uid/gid (an owner above 2097151 becomes
 * 2097151). This writer only encodes dsec's own entries, never parses input; GNU tar and
 * tar-stream read its output back in test/state/tar-archives.test.ts and oci-units.test.ts.
 */

export interface TarWriteEntry {
  name: string;
  type: 'file' | 'dir' | 'symlink' | 'link';
  mode: number;
  uid: number;
  gid: number;
  /** Seconds since the epoch. */
  mtime: number;
  data?: Buffer;
  linkname?: string;
}

const TYPEFLAG = { file: '0', link: '1', symlink: '2', dir: '5' } as const;

function octal(n: number, width: number): string {
  return n.toString(8).padStart(width - 1, '0') + '\0';
}

function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  const base = Buffer.byteLength(body);
  let len = base + 1;
  while (String(len).length + base !== len) len = String(len).length + base;
  return `${len}${body}`;
}

function header(name: string, type: string, mode: number, uid: number, gid: number, size: number, mtime: number, linkname: string): Buffer {
  const h = Buffer.alloc(512);
  h.write(name, 0, 100, 'utf8');
  h.write(octal(mode & 0o7777, 8), 100, 'latin1');
  h.write(octal(uid, 8), 108, 'latin1');
  h.write(octal(gid, 8), 116, 'latin1');
  h.write(octal(size, 12), 124, 'latin1');
  h.write(octal(Math.floor(mtime), 12), 136, 'latin1');
  h.write('        ', 148, 'latin1');
  h.write(type, 156, 'latin1');
  h.write(linkname, 157, 100, 'utf8');
  h.write('ustar\0', 257, 'latin1');
  h.write('00', 263, 'latin1');
  let sum = 0;
  for (const b of h) sum += b;
  h.write(octal(sum, 7) + ' ', 148, 'latin1');
  return h;
}

function padded(data: Buffer): Buffer[] {
  const pad = (512 - (data.length % 512)) % 512;
  return pad ? [data, Buffer.alloc(pad)] : [data];
}

/** The blocks of one entry (a pax header first when needed). */
export function tarEntry(e: TarWriteEntry): Buffer[] {
  const data = e.type === 'file' ? (e.data ?? Buffer.alloc(0)) : Buffer.alloc(0);
  const name = e.type === 'dir' && !e.name.endsWith('/') ? `${e.name}/` : e.name;
  const linkname = e.linkname ?? '';
  const pax: string[] = [];
  const MAX_ID = 0o7777777;
  if (Buffer.byteLength(name) > 100 || /[^\x20-\x7e]/.test(name)) pax.push(paxRecord('path', name));
  if (Buffer.byteLength(linkname) > 100 || /[^\x20-\x7e]/.test(linkname)) pax.push(paxRecord('linkpath', linkname));
  if (data.length > 0o77777777777) pax.push(paxRecord('size', String(data.length)));
  if (e.uid > MAX_ID) pax.push(paxRecord('uid', String(e.uid)));
  if (e.gid > MAX_ID) pax.push(paxRecord('gid', String(e.gid)));
  const out: Buffer[] = [];
  if (pax.length) {
    const body = Buffer.from(pax.join(''), 'utf8');
    out.push(header('PaxHeader', 'x', 0o644, 0, 0, body.length, e.mtime, ''), ...padded(body));
  }
  const short = (s: string): string => (Buffer.byteLength(s) > 100 ? Buffer.from(s).subarray(0, 100).toString('utf8') : s);
  out.push(
    header(short(name), TYPEFLAG[e.type], e.mode, Math.min(e.uid, MAX_ID), Math.min(e.gid, MAX_ID), data.length, e.mtime, short(linkname)),
    ...padded(data),
  );
  return out;
}

/** A whole archive in memory, with the end-of-archive blocks. */
export function tarArchive(entries: TarWriteEntry[]): Buffer {
  return Buffer.concat([...entries.flatMap(tarEntry), Buffer.alloc(1024)]);
}
