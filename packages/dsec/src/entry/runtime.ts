/**
 * Entry point `dsec/runtime`, for programs that run dsec inside themselves (the benchmark suite,
 * `packages/bench`): an all-in-one started in-process on options compiled as the CLI compiles
 * them, the stock images built into its store (E2B's `base` template from the host's cache, for
 * `dsec bench rollout`'s E2B SDK), the host's microVM readiness, and the CLI's own
 * paths and progress line for a tool that starts `dsec control` / `dsec edge` as children.
 * Nothing here is a stable API for other projects; it is the short list the bench may use.
 */
import { fileURLToPath } from 'node:url';

export { HostNotReadyError, startAllInOne, type RunningDsec } from '../runtime/all-in-one.js';
export { vmCheck } from '../runtime/vm-check.js';
export { compileOptions, OptionsError } from '../config/options.js';
export { StateStore } from '../control/state-store.js';
export { buildBusyboxImage } from '../image/builders/busybox.js';
export { buildDebianImage } from '../image/builders/debian.js';
export { buildFnRuntimeImage } from '../image/builders/fn-runtime.js';
export { ensureE2bBaseImage } from '../control/e2b/base-template-cache.js';
export type { LayerDigest } from '../image/layer-store.js';
export { Progress } from '../cli/progress.js';
export { DSEC_VERSION } from '../version.js';

/** The compiled CLI of this checkout: the very `dsec control` / `dsec edge` an operator runs. */
export const DSEC_CLI_MAIN: string = fileURLToPath(new URL('../cli/main.js', import.meta.url));
