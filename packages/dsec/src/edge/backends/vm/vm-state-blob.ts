import { createHash, randomBytes } from 'node:crypto';
import { createWriteStream, lstatSync, mkdirSync, readFileSync, renameSync, rmSync, statSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { Type } from 'typebox';
import { Value } from 'typebox/value';
import { ImageConfig } from '@dsec/sdk/schema';
import { ApiError } from '../../../api-error.js';
import { runToolOrThrow, ToolError } from '../../../host/run-tool.js';
import { isLayerDigest, type LayerDigest } from '../../../image/layer-store.js';
import type { BlobSource } from '../../node/blob-source.js';
import { SandboxLimits } from '../../protocol/schemas.js';
import type { SnapshotRecord } from './vm-record.js';

/**
 * A VM's state as one blob of the cluster's blob store, so that any edge can start the VM from it
 * (a move between nodes): a GNU tar, sparse, zstd-compressed, of
 * - `record.json`: what the VM was made with (SnapshotRecord: backend, layers, config, env,
 *   limits, the agent channel's key, which the guest holds in its memory);
 * - `state.bin`: QEMU's migration stream of the stopped VM (memory and device state, vm-state.ts);
 * - `upper.img`: its writable disk, holes kept (a 2 GiB disk the guest wrote 20 MiB of is ~20 MiB).
 * The blob travels as layers do (BlobSource: the local store, or the control plane's
 * `/v1/blobs/{digest}`), so it is content-addressed and checked against its digest on arrival
 * before tar reads a byte of it. It holds the guest's memory: it is as secret as the sandbox.
 */
export const STATE_RECORD = 'record.json';
export const STATE_MEMORY = 'state.bin';
export const STATE_DISK = 'upper.img';

/**
 * zstd's fastest level on every core: an idle 256 MiB guest's 88 MiB of state and disk pack to
 * 44 MiB (16 of them random bytes in its tmpfs) in ~0.4 s here, and unpack in ~0.2 s; every
 * hop after it (hashing, the upload, the store's write, the download) carries half the bytes.
 */
const COMPRESS = 'zstd -1 -T0';

/** How long packing or unpacking a state may take (a guest of a few GiB on a loaded disk). */
const STATE_TAR_TIMEOUT_MS = 10 * 60_000;

/** What a state blob's record must hold; anything else in it is ignored. */
const StateRecord = Type.Object({
  backend: Type.Union([Type.Literal('microvm'), Type.Literal('vm')]),
  layers: Type.Array(Type.String({ pattern: '^sha256:[0-9a-f]{64}$' }), { minItems: 1, maxItems: 60 }),
  config: ImageConfig,
  env: Type.Record(Type.String(), Type.String()),
  limits: SandboxLimits,
  agentKey: Type.String({ pattern: '^[0-9a-f]{64}$' }),
  /** Saved from a guest whose RAM is the memory backend `mem` (vm-record.ts): restored the same way. */
  memoryBackend: Type.Optional(Type.Boolean()),
});

/**
 * Packs `stage` (its record.json and state.bin) and the VM's disk into one blob and puts it in the
 * blob source; the staged tar is consumed. The disk is read in place: the VM is stopped.
 */
export async function putStateBlob(
  stage: string,
  disk: string,
  opts: { tmpDir: string; blobs: BlobSource; signal?: AbortSignal | undefined },
): Promise<{ digest: LayerDigest; bytes: number }> {
  const file = join(opts.tmpDir, `vm-state-${randomBytes(6).toString('hex')}.tar`);
  if (basename(disk) !== STATE_DISK) throw new Error(`the VM's disk is ${disk}, not ${STATE_DISK}`);
  const signal = AbortSignal.any([AbortSignal.timeout(STATE_TAR_TIMEOUT_MS), ...(opts.signal ? [opts.signal] : [])]);
  try {
    await runToolOrThrow(
      'tar',
      [
        '--create',
        '--format=gnu',
        '--sparse',
        `--use-compress-program=${COMPRESS}`,
        '--file',
        file,
        '-C',
        stage,
        STATE_RECORD,
        STATE_MEMORY,
        '-C',
        dirname(disk),
        basename(disk),
      ],
      { signal },
    );
    const bytes = statSync(file).size;
    return { digest: await opts.blobs.put(file), bytes };
  } finally {
    rmSync(file, { force: true });
  }
}

/**
 * Brings state blob `digest` into `dir` (made here, mode 0700): record.json, state.bin and
 * upper.img, each a regular file. From the node's own store when it has the blob, else fetched
 * whole and checked against its digest first. The record is checked against what the create
 * asks for: the same backend and layers (the disk's overlay sits on exactly those).
 */
export async function fetchStateBlob(
  blobs: BlobSource,
  digest: LayerDigest,
  dir: string,
  expect: { backend: string; layers: string[] },
): Promise<SnapshotRecord> {
  mkdirSync(dir, { mode: 0o700 });
  let archive = blobs.localPath(digest);
  if (!archive) {
    archive = join(dir, 'state.tar');
    await download(blobs, digest, archive);
  }
  try {
    await runToolOrThrow(
      'tar',
      [
        '--extract',
        '--zstd',
        '--file',
        archive,
        '-C',
        dir,
        '--no-same-owner',
        '--no-same-permissions',
        STATE_RECORD,
        STATE_MEMORY,
        STATE_DISK,
      ],
      { signal: AbortSignal.timeout(STATE_TAR_TIMEOUT_MS) },
    );
  } catch (err) {
    if (err instanceof ToolError)
      throw new ApiError('INVALID_REQUEST', `${digest} is not a VM state blob: ${err.result.stderr.trim()}`, { restoreState: digest });
    throw err;
  } finally {
    if (archive.startsWith(dir + '/')) rmSync(archive, { force: true });
  }
  for (const name of [STATE_RECORD, STATE_MEMORY, STATE_DISK]) {
    if (!lstatSync(join(dir, name)).isFile())
      throw new ApiError('INVALID_REQUEST', `VM state ${digest}: ${name} is not a regular file`, { restoreState: digest });
  }
  let record: unknown;
  try {
    record = JSON.parse(readFileSync(join(dir, STATE_RECORD), 'utf8'));
  } catch (err) {
    throw new ApiError('INVALID_REQUEST', `VM state ${digest}: its record is not JSON: ${(err as Error).message}`, {
      restoreState: digest,
    });
  }
  if (!Value.Check(StateRecord, record)) {
    const first = [...Value.Errors(StateRecord, record)][0];
    throw new ApiError('INVALID_REQUEST', `VM state ${digest}: its record is not a VM's: ${first?.message ?? 'invalid'}`, {
      restoreState: digest,
    });
  }
  const r = record as SnapshotRecord;
  if (r.backend !== expect.backend)
    throw new ApiError('INVALID_REQUEST', `VM state ${digest} is a ${r.backend}'s; the create asks for a ${expect.backend}`, {
      restoreState: digest,
      backend: r.backend,
    });
  if (r.layers.length !== expect.layers.length || r.layers.some((l, i) => l !== expect.layers[i] || !isLayerDigest(l)))
    throw new ApiError('INVALID_REQUEST', `VM state ${digest} sits on other layers than the create names`, {
      restoreState: digest,
      layers: r.layers,
    });
  return r;
}

/** The blob from the blob source into `file`, hashed on the way; a blob that is not `digest` is refused. */
async function download(blobs: BlobSource, digest: LayerDigest, file: string): Promise<void> {
  let body;
  try {
    body = await blobs.open(digest);
  } catch (err) {
    if (err instanceof ApiError && err.code === 'IMAGE_NOT_FOUND')
      throw new ApiError('BLOB_NOT_FOUND', `no VM state ${digest} in the cluster's blob store`, { restoreState: digest });
    throw err;
  }
  const hash = createHash('sha256');
  const partial = `${file}.partial`;
  try {
    await pipeline(
      body,
      new Transform({
        transform(chunk: Buffer, _e, cb) {
          hash.update(chunk);
          cb(null, chunk);
        },
      }),
      createWriteStream(partial, { mode: 0o600 }),
      { signal: AbortSignal.timeout(STATE_TAR_TIMEOUT_MS) },
    );
    const got = `sha256:${hash.digest('hex')}`;
    if (got !== digest) throw new ApiError('INTERNAL', `the blob store gave bytes hashing to ${got} for VM state ${digest}`, { digest });
    renameSync(partial, file);
  } finally {
    rmSync(partial, { force: true });
  }
}
