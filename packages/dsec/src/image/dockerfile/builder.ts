import type { DockerfileBuildOptions, DockerfileBuildResult } from './build-options.js';
import { DockerfileBuild, type InstructionHandler } from './build-state.js';
import { CONFIG_INSTRUCTIONS } from './config-instructions.js';
import { DockerfileError, escapeOf, parseDockerfile } from './parser.js';
import { createPendingWorkdir } from './sandbox-steps.js';
import { STEP_INSTRUCTIONS } from './step-instructions.js';

/**
 * `dsec image build -f Dockerfile CONTEXT`: every RUN and COPY/ADD step runs in a real sandbox
 * created from the image so far; its changes are captured with the snapshot path (pack_diff) as
 * one layer, and the step's result is an (unnamed) image = parent layers + that layer. ENV,
 * WORKDIR, USER, CMD, ENTRYPOINT, LABEL, ARG and SHELL only change the config. Each step's
 * result is cached by parent image + instruction (+ copied files' hash, + build args), so a
 * rebuild with no change reuses every step.
 *
 * The build's state is build-state.ts; the instructions are config-instructions.ts (config
 * only) and step-instructions.ts (RUN, COPY, ADD: sandbox-steps.ts runs them or finds them in
 * the cache); image-users.ts turns user names into numbers through the image's own files.
 */

export type { DockerfileBuildOptions, DockerfileBuildResult } from './build-options.js';

const INSTRUCTIONS = new Map<string, InstructionHandler>([...Object.entries(CONFIG_INSTRUCTIONS), ...Object.entries(STEP_INSTRUCTIONS)]);

export async function buildDockerfile(opts: DockerfileBuildOptions): Promise<DockerfileBuildResult> {
  const instructions = parseDockerfile(opts.dockerfile);
  if (!instructions.length) throw new DockerfileError('the Dockerfile has no instructions');
  const b = new DockerfileBuild(opts);
  for (const [n, ins] of instructions.entries()) {
    const esc = escapeOf(ins);
    b.progress(`Step ${n + 1}/${instructions.length} : ${ins.original}`);
    opts.onStep?.(n, instructions.length, ins.original);
    const handler = INSTRUCTIONS.get(ins.keyword);
    if (!handler) throw new DockerfileError(`${ins.keyword} is not supported`, ins.line);
    await handler(b, ins, esc);
  }
  return finish(b, instructions.length);
}

/** After the last instruction: the working directory created, unused build arguments noted, the image put and tagged. */
async function finish(b: DockerfileBuild, steps: number): Promise<DockerfileBuildResult> {
  const { images, opts } = b;
  const s = b.stage!;
  if (!s) throw new DockerfileError('the Dockerfile has no FROM');
  if (b.pendingWorkdir) await createPendingWorkdir(b);
  for (const a of b.buildArgs.keys()) if (!b.usedBuildArgs.has(a)) b.warn(`build argument ${a} was not consumed by any ARG`);
  const id = images.put({ layers: s.layers, config: s.config });
  if (opts.name) images.tag(opts.name, id);
  b.progress(
    `Successfully built ${id.slice(0, 19)}${opts.name ? ` and tagged ${opts.name}` : ''} (${b.cached} cached, ${b.executed} run, ${b.layersAdded} layers added)`,
  );
  return {
    id,
    ...(opts.name ? { name: opts.name } : {}),
    steps,
    cached: b.cached,
    executed: b.executed,
    layersAdded: b.layersAdded,
    config: s.config,
    warnings: b.warnings,
  };
}
