import type { ImageConfig } from '@dsec/sdk/schema';
import type { ImageId, ImageStore } from '../image-store.js';
import type { BuildSandboxes } from './sandboxes.js';

export interface DockerfileBuildOptions {
  images: ImageStore;
  sandboxes: BuildSandboxes;
  /** The Dockerfile's text. */
  dockerfile: string;
  contextDir: string;
  /** Tag the final image with this name. */
  name?: string;
  buildArgs?: Record<string, string>;
  /** Ignore the cache (results are still recorded). */
  noCache?: boolean;
  /** Step headers and notes, one line each ("Step 3/7 : RUN …", " ---> CACHED …"). */
  progress?: (line: string) => void;
  /** Called as each instruction starts: its index (0-based), their number, the instruction (for a progress bar). */
  onStep?: (index: number, total: number, instruction: string) => void;
  /** RUN output as it comes; default: written line by line to progress. */
  output?: (chunk: Buffer) => void;
  /**
   * Fetches an image FROM names by a registry reference (HOST[:PORT]/REPO[:TAG|@sha256:…]) that
   * the store does not have, as `dsec image pull` does; returns its id. Without it, such a FROM
   * is refused with a message that says to pull first.
   */
  pull?: (ref: string, progress: (line: string) => void) => Promise<string>;
  /** Per RUN command. @default 3600000 */
  runTimeoutMs?: number;
}

export interface DockerfileBuildResult {
  id: ImageId;
  name?: string;
  /** Instructions in the Dockerfile. */
  steps: number;
  /** RUN/COPY/ADD steps (and WORKDIR creation) reused from the cache. */
  cached: number;
  /** Such steps run in a sandbox this time. */
  executed: number;
  /** Layers this build added (steps that changed nothing add none). */
  layersAdded: number;
  config: ImageConfig;
  warnings: string[];
}
