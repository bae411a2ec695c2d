import { spawn } from 'node:child_process';
import { closeSync, createReadStream, openSync, readSync } from 'node:fs';
import { Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import * as zlib from 'node:zlib';
import { which } from '../../host/doctor.js';

export type Compression = 'none' | 'gzip' | 'zstd';

export class CompressionError extends Error {
  override readonly name = 'CompressionError';
}

/** What a stream's first bytes say it is. */
export function sniffCompression(head: Buffer): Compression {
  if (head.length >= 2 && head[0] === 0x1f && head[1] === 0x8b) return 'gzip';
  if (head.length >= 4 && head.readUInt32LE(0) === 0xfd2fb528) return 'zstd';
  return 'none';
}

export function sniffFile(path: string): Compression {
  const fd = openSync(path, 'r');
  try {
    const head = Buffer.alloc(4);
    const n = readSync(fd, head, 0, 4, 0);
    return sniffCompression(head.subarray(0, n));
  } finally {
    closeSync(fd);
  }
}

function nativeZstd(): (() => NodeJS.ReadWriteStream) | undefined {
  return (zlib as unknown as { createZstdDecompress?: () => NodeJS.ReadWriteStream }).createZstdDecompress;
}

function requireZstdCommand(): void {
  if (!which('zstd')) {
    throw new CompressionError(
      'this data is zstd-compressed and neither node (< 22.15 has no zstd) nor a `zstd` command can decompress it: install zstd (apt-get install zstd)',
    );
  }
}

/** `zstd -d` as a child process: compressed bytes in (from `input` or a file), plain bytes out. */
function zstdCommand(input: { file: string } | { stream: Readable }): Readable {
  requireZstdCommand();
  const args = ['-dcq'];
  if ('file' in input) args.push('--', input.file);
  const child = spawn('zstd', args, { stdio: ['file' in input ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const out = child.stdout!;
  child.on('close', (code) => {
    if (code !== 0) out.destroy(new CompressionError(`zstd -d failed (exit ${code}): ${stderr.trim()}`));
  });
  if ('stream' in input) {
    const stdin = child.stdin!;
    stdin.on('error', () => {}); // EPIPE when zstd stops early; its exit status tells the story
    input.stream.on('error', (err) => out.destroy(err));
    input.stream.pipe(stdin);
  }
  return out;
}

/** Decompresses `source` as `kind`; a pass-through for 'none'. */
function decompress(source: Readable, kind: Compression): AsyncIterable<Buffer> {
  if (kind === 'none') return source;
  if (kind === 'zstd' && !nativeZstd()) return zstdCommand({ stream: source });
  const d = (kind === 'gzip' ? createGunzip() : nativeZstd()!()) as unknown as Readable & NodeJS.WritableStream;
  source.on('error', (err) => d.destroy(err));
  return source.pipe(d);
}

/** A file's decompressed bytes (compression sniffed from its first bytes). */
export function openDecompressed(path: string): AsyncIterable<Buffer> {
  const kind = sniffFile(path);
  if (kind === 'zstd' && !nativeZstd()) return zstdCommand({ file: path });
  return decompress(createReadStream(path, { highWaterMark: 1 << 20 }), kind);
}

/**
 * Peeks at the first bytes of a stream and returns the decompressed stream (an archive that was
 * gzipped or zstd-compressed as a whole, e.g. `docker save | gzip`).
 */
export async function decompressStream(source: AsyncIterable<Buffer>): Promise<AsyncIterable<Buffer>> {
  const it = source[Symbol.asyncIterator]();
  const head: Buffer[] = [];
  let len = 0;
  let done = false;
  while (len < 4) {
    const r = await it.next();
    if (r.done) {
      done = true;
      break;
    }
    const b = Buffer.from(r.value);
    head.push(b);
    len += b.length;
  }
  const whole = (async function* () {
    yield* head;
    if (!done) for (let r = await it.next(); !r.done; r = await it.next()) yield Buffer.from(r.value);
  })();
  return decompress(Readable.from(whole, { objectMode: false }), sniffCompression(Buffer.concat(head)));
}
