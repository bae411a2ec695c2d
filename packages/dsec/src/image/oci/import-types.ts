import type { ImageConfig } from '@dsec/sdk/schema';
import type { ErofsBuildOptions } from '../erofs.js';
import type { ImageId } from '../image-store.js';
import type { LayerDigest } from '../layer-digest.js';

// The types of `dsec image import` (oci-import.ts): its options and result, its error, and the
// archive's documents as read (OCI descriptors, the image config, the image found).

export interface ImportOptions {
  /** Tag the image with this name; default: the name the archive gives it. */
  name?: string;
  /** Merge every layer into one EROFS layer (whiteouts applied as deletions). */
  squash?: boolean;
  /** Which image, when the archive holds several: a name it is tagged with in the archive. */
  ref?: string;
  progress?: (message: string) => void;
  /** Called as each layer is taken up: its index (0-based), the number of layers (for a progress bar). */
  onLayer?: (index: number, total: number) => void;
  /** @default 'lz4' */
  compression?: ErofsBuildOptions['compression'];
  /** false: record the image without naming it (the caller names it). @default true */
  tag?: boolean;
  /** Called with the image's id before it is recorded (a pull's owner goes in first); a throw stops the import. */
  beforeRecord?: (id: ImageId) => Promise<void>;
}

export type ImportFormat = 'oci-layout' | 'docker-save';

export interface ImportedLayer {
  /** sha256 of the uncompressed layer tar, as the image config lists it. */
  diffId: string;
  /** The EROFS layer it became (for a squashed import: the one layer, on every entry). */
  digest: LayerDigest;
  /** Reused from an earlier import of the same layer: nothing was unpacked. */
  cached: boolean;
  /** An empty layer (no entries): it adds nothing and is left out of the image. */
  empty: boolean;
  entries: number;
  bytes: number;
  whiteouts: number;
  opaqueDirs: number;
}

export interface ImportResult {
  id: ImageId;
  name: string;
  format: ImportFormat;
  /** The name the archive gave the image, if any. */
  sourceRef?: string;
  squashed: boolean;
  layers: ImportedLayer[];
  config: ImageConfig;
  warnings: string[];
}

/** The archive is not one dsec can import (malformed, unsafe, wrong digest…): the caller's fault. */
export class ImportError extends Error {
  override readonly name = 'ImportError';
}

export interface Descriptor {
  mediaType?: string;
  digest: string;
  size?: number;
  platform?: { os?: string; architecture?: string; variant?: string };
  annotations?: Record<string, string>;
}

export interface OciImageConfig {
  architecture?: string;
  os?: string;
  config?: {
    Env?: string[] | null;
    WorkingDir?: string;
    User?: string;
    Entrypoint?: string[] | null;
    Cmd?: string[] | null;
    Labels?: Record<string, string> | null;
  } | null;
  rootfs?: { type?: string; diff_ids?: string[] };
}

/** One image found in a layout or archive, verified up to its layer blobs. */
export interface SourceImage {
  format: ImportFormat;
  refName?: string;
  manifestDigest?: string;
  configDigest: string;
  config: OciImageConfig;
  layers: { file: string; diffId: string; label: string }[];
}
