import type { ImageConfig } from '@dsec/sdk/schema';
import type { Crun } from '../edge/crun.js';
import { mergeEnv, parseUser, type ProcessSpec } from '../edge/oci-config.js';

/** What the exec engine needs to know of a sandbox to start processes in it from outside. */
export interface ExecTarget {
  crun: Crun;
  id: string;
  /** Edge-side scratch directory (never inside the sandbox) for process specs and pid files. */
  scratchDir: string;
  /** The sandbox's root as the host sees it (for checks such as "is there a /bin/bash"). */
  rootfs: string;
  config: ImageConfig;
  env: Record<string, string>;
}

/** argv, env and cwd for a command: image env < sandbox env < command env. */
export function processSpecFor(
  target: ExecTarget,
  cmd: string | string[],
  opts: { cwd?: string | undefined; env?: Record<string, string> | undefined } = {},
): ProcessSpec {
  return {
    args: typeof cmd === 'string' ? ['/bin/sh', '-c', cmd] : cmd,
    env: mergeEnv(target.config.env, target.env, opts.env ?? {}),
    cwd: opts.cwd ?? target.config.cwd,
    user: parseUser(target.config.user),
  };
}
