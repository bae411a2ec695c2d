import type { ImageId } from '../image-store.js';

export interface PullResult {
  id: ImageId;
  /** The manifest digest the image was pulled by. */
  digest: string;
  name: string | undefined;
  /** Layers fetched (the others were in the layer store already). */
  fetchedLayers: number;
  bytes: number;
  /** Times a layer download broke off and went on from where it stopped (a Range request). */
  resumes: number;
}

export interface PullOptions {
  /** Tag the pulled image with this name (default: the repository's last component and the tag). */
  name?: string | undefined;
  progress?: (line: string) => void;
  /** Bytes of a layer arrived (for progress bars, and for tests that break a pull in the middle). */
  onBytes?: (layer: string, received: number, size: number) => void;
  /** How many times one layer may break off and resume before the pull fails (default 20). */
  maxResumes?: number;
  /** false: store the image but give it no name (the caller names it); `name` is still reported. */
  tag?: boolean;
  /**
   * Called with the image's id once its layers are verified and before the image is recorded (the
   * control plane records which project owns it first, so it is never visible as shared). A throw
   * stops the pull before the image is recorded.
   */
  adopt?: (id: ImageId) => Promise<void>;
}
