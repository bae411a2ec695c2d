/**
 * dsec's Python SDK in `dsec bench rollout`: python/bench/rollout_steps.py, one python3 process
 * per size, one asyncio loop over N `dsec.AsyncSandbox`es (the TS SDK's sandboxes), spoken to in
 * JSON lines. Its start-up and connects are outside the timed runs; the wall time is the script's own.
 */
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { which } from 'dsec/host';
import { LineChild } from './rollout-child.js';
import type { RolloutClient } from './rollout-clients.js';
import type { LoopsOutcome, StepPlan } from './rollout-step.js';

/** The repository's python/ (the SDK and its bench scripts), from dist/src/scenarios/. */
const PYTHON_DIR = fileURLToPath(new URL('../../../../../python/', import.meta.url));
const SCRIPT = `${PYTHON_DIR}bench/rollout_steps.py`;

/** Debian's python3 first (what scripts/setup installs, and what the suite runs the SDK's tests with). */
function python3(): string | undefined {
  return existsSync('/usr/bin/python3') ? '/usr/bin/python3' : which('python3');
}

export class PythonSdkClient implements RolloutClient {
  readonly name = 'python-sdk';
  readonly description =
    "dsec's Python SDK (python/dsec, asyncio) in a python3 process: files.write, 10 × commands.run('…'), files.read_text, one event loop for all sandboxes; on the ts-sdk's sandboxes";
  version = 'python3';
  #child?: LineChild;

  /** `sandboxIds()` names the sandboxes to drive when it opens (the TS SDK's, made just before). */
  constructor(
    private readonly conn: { url: string; apiKey: string },
    private readonly sandboxIds: () => string[],
    readonly image: string,
  ) {}

  /** Why it cannot run here, or undefined. */
  static unavailableReason(): string | undefined {
    if (!python3()) return 'no python3 on this host';
    if (!existsSync(`${PYTHON_DIR}dsec/__init__.py`) || !existsSync(SCRIPT))
      return `the Python SDK and its rollout script are not beside this bench (${PYTHON_DIR})`;
    return undefined;
  }

  async open(): Promise<void> {
    this.#child = new LineChild(python3() ?? 'python3', [SCRIPT], { ...process.env, PYTHONPATH: PYTHON_DIR.replace(/\/$/, '') });
    const r = await this.#child.ask({ op: 'connect', url: this.conn.url, apiKey: this.conn.apiKey, ids: this.sandboxIds() });
    this.version = `Python ${String(r['python'])}, dsec SDK from ${PYTHON_DIR}`;
  }

  async run(plans: StepPlan[][]): Promise<LoopsOutcome> {
    if (!this.#child) throw new Error('the Python SDK client is not open');
    return (await this.#child.ask({ op: 'run', plans })) as unknown as LoopsOutcome;
  }

  async close(): Promise<void> {
    await this.#child?.close(5000);
    this.#child = undefined;
  }
}
