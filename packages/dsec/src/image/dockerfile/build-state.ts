import { createHash } from 'node:crypto';
import type { ImageConfig } from '@dsec/sdk/schema';
import type { ImageStore } from '../image-store.js';
import type { LayerDigest } from '../layer-digest.js';
import type { DockerfileBuildOptions } from './build-options.js';
import { BuildCache } from './cache.js';
import { IgnoreRules } from './context.js';
import { DockerfileError, type Instruction } from './parser.js';
import type { BuildSandboxes } from './sandboxes.js';

/** The image built so far: its layers and config (instructions change them in place). */
export interface StageImage {
  layers: LayerDigest[];
  config: ImageConfig;
}

export function envMap(env: string[]): Map<string, string> {
  const m = new Map<string, string>();
  for (const kv of env) {
    const i = kv.indexOf('=');
    if (i > 0) m.set(kv.slice(0, i), kv.slice(i + 1));
  }
  return m;
}

export function stateKey(layers: readonly string[], config: ImageConfig): string {
  return createHash('sha256').update(JSON.stringify({ layers, config })).digest('hex');
}

/** A Dockerfile build in progress: what its instructions read and change, in order. */
export class DockerfileBuild {
  readonly images: ImageStore;
  readonly sandboxes: BuildSandboxes;
  readonly progress: (line: string) => void;
  readonly cache: BuildCache;
  readonly ignore: IgnoreRules;
  readonly buildArgs: Map<string, string>;
  readonly usedBuildArgs = new Set<string>();
  readonly warnings: string[] = [];

  /** ARGs before the FROM. */
  readonly globalArgs = new Map<string, string | undefined>();
  /** ARGs of the stage (after FROM). */
  stageArgs = new Map<string, string | undefined>();
  /** Undefined before FROM. */
  stage: StageImage | undefined;
  /** The current stage's name (`FROM … AS name`, lower-cased as Docker matches it). */
  stageName: string | undefined;
  /** Stages finished by a later FROM, in order: what `COPY --from` and `FROM <stage>` name. */
  readonly stages: { name: string | undefined; image: StageImage }[] = [];
  shell = ['/bin/sh', '-c'];
  /** A CMD of this Dockerfile (not the base image's): a later ENTRYPOINT keeps it. */
  cmdSetHere = false;
  /** WORKDIR moved to a directory the next step that changes files (or the end) creates. */
  pendingWorkdir = false;
  /** /etc/passwd and /etc/group of a state, read from a sandbox (image-users.ts). */
  etcCache: { key: string; passwd?: string; group?: string } | undefined;

  cached = 0;
  executed = 0;
  layersAdded = 0;

  constructor(readonly opts: DockerfileBuildOptions) {
    this.images = opts.images;
    this.sandboxes = opts.sandboxes;
    this.progress = opts.progress ?? (() => {});
    this.cache = new BuildCache(opts.images);
    this.ignore = IgnoreRules.load(opts.contextDir);
    this.buildArgs = new Map(Object.entries(opts.buildArgs ?? {}));
  }

  warn(m: string): void {
    this.warnings.push(m);
    this.progress(` ---> note: ${m}`);
  }

  /**
   * A finished stage by its name or its index (`COPY --from=build`, `--from=0`, `FROM build`);
   * undefined when none has that name (then it names an image).
   */
  finishedStage(ref: string): StageImage | undefined {
    if (/^\d+$/.test(ref)) return this.stages[Number(ref)]?.image;
    return this.stages.find((st) => st.name === ref.toLowerCase())?.image;
  }

  /** The image so far, for an instruction that needs a FROM before it. */
  need(ins: Instruction): StageImage {
    if (!this.stage) throw new DockerfileError(`${ins.keyword} before FROM`, ins.line);
    return this.stage;
  }

  /** Variables for substitution: build arguments, overridden by the environment. */
  vars(): Map<string, string> {
    const m = new Map<string, string>();
    for (const [k, v] of this.stage ? this.stageArgs : this.globalArgs) if (v !== undefined) m.set(k, v);
    if (this.stage) for (const [k, v] of envMap(this.stage.config.env)) m.set(k, v);
    return m;
  }

  /** Where a RUN's output goes: opts.output, or progress line by line. */
  lineWriter(): ((b: Buffer) => void) & { flush(): void } {
    let pending = '';
    const f = (b: Buffer): void => {
      if (this.opts.output) return this.opts.output(b);
      pending += b.toString('utf8');
      const lines = pending.split('\n');
      pending = lines.pop()!;
      for (const l of lines) this.progress(`  ${l}`);
    };
    return Object.assign(f, {
      flush: () => {
        if (pending) this.progress(`  ${pending}`);
        pending = '';
      },
    });
  }
}

/** Runs one instruction of the build; `esc` is the Dockerfile's escape character. */
export type InstructionHandler = (b: DockerfileBuild, ins: Instruction, esc: string) => void | Promise<void>;
