/**
 * The ways `dsec bench rollout` drives its sandboxes: dsec's TypeScript SDK and E2B's SDK against
 * dsec's E2B layer (each in a node process of its own), and a runtime's own exec (raw `crun exec`,
 * `docker exec`, `podman exec`) one process per call, as a harness that shells out does. The
 * Python SDK is rollout-python.ts.
 */
import { fileURLToPath } from 'node:url';
import { Sandbox } from '@dsec/sdk';
import type { SandboxLimits } from 'dsec/container';
import type { Peer } from '../peers/peer.js';
import { pool } from '../rounds.js';
import { LineChild } from './rollout-child.js';
import { runLoops, type LoopsOutcome, type StepPlan, type StepTarget } from './rollout-step.js';

export type RolloutClientName = 'ts-sdk' | 'ts-sdk bash -l' | 'python-sdk' | 'e2b-sdk' | 'crun exec' | 'docker exec' | 'podman exec';

/** Sandboxes made at once while a client opens (creates are not what is measured). */
const CREATES_IN_FLIGHT = 8;

/** One way of driving N sandboxes through the step loop. */
export interface RolloutClient {
  readonly name: RolloutClientName;
  /** What one step's calls are, exactly. */
  readonly description: string;
  readonly version: string;
  /** The image its sandboxes run. */
  readonly image: string;
  /** Makes (or connects to) `count` sandboxes; untimed. */
  open(count: number): Promise<void>;
  /** `plans[i]` on sandbox i, all sandboxes at once. */
  run(plans: StepPlan[][]): Promise<LoopsOutcome>;
  /** Removes what `open` made. Safe to call twice. */
  close(): Promise<void>;
}

/** The TS SDK's and E2B's SDK's loops run in a node process of their own (rollout-node-client.ts). */
const NODE_CLIENT = fileURLToPath(new URL('./rollout-node-client.js', import.meta.url));

/**
 * dsec's TypeScript SDK: files.write, commands.run (a string: `sh -c`), files.readText. With
 * `loginShell`, on E2B's base template and each command as E2B's SDK runs it (`/bin/bash -l -c`):
 * the attribution between ts-sdk and e2b-sdk (the login shell and Debian's tools on one side of
 * it, E2B's protocol on the other).
 */
export class TsSdkClient implements RolloutClient {
  readonly name: RolloutClientName;
  readonly description: string;
  /** Made here (untimed), driven from the child; the Python SDK drives them too. */
  sandboxes: Sandbox[] = [];
  #child = new LineChild(process.execPath, [NODE_CLIENT]);

  constructor(
    private readonly conn: { url: string; apiKey: string },
    readonly image: string,
    private readonly limits: SandboxLimits,
    private readonly labels: Record<string, string>,
    readonly version: string,
    private readonly loginShell = false,
  ) {
    this.name = loginShell ? 'ts-sdk bash -l' : 'ts-sdk';
    this.description = loginShell
      ? "as ts-sdk, on E2B's base template, each command as E2B's SDK runs it: commands.run(['/bin/bash', '-l', '-c', '…']) (attribution: e2b-sdk − this is E2B's protocol and SDK, this − ts-sdk the login shell and Debian's tools)"
      : "@dsec/sdk in a node process of its own: files.write, 10 × commands.run('…') (POST /v1/sandboxes/:id/exec, `sh -c`), files.readText; HTTP keep-alive on loopback";
  }

  async open(count: number): Promise<void> {
    const made: Sandbox[] = [];
    try {
      await pool(count, CREATES_IN_FLIGHT, async () => {
        made.push(await Sandbox.create({ ...this.conn, image: this.image, resources: { ...this.limits }, labels: this.labels }));
      });
    } finally {
      this.sandboxes.push(...made);
    }
    await this.#child.ask({
      op: 'open',
      client: 'ts-sdk',
      ...this.conn,
      ids: this.sandboxes.map((s) => s.id),
      loginShell: this.loginShell,
    });
  }

  async run(plans: StepPlan[][]): Promise<LoopsOutcome> {
    return (await this.#child.ask({ op: 'run', plans })) as unknown as LoopsOutcome;
  }

  async close(): Promise<void> {
    await this.#child.close();
    const all = this.sandboxes;
    this.sandboxes = [];
    await pool(all.length, CREATES_IN_FLIGHT, async (i) => void (await all[i]!.kill().catch(() => undefined)));
  }
}

/** E2B's SDK (the `e2b` npm package) against dsec's E2B layer, as root (E2B's default user would add a setpriv per command). */
export class E2bSdkClient implements RolloutClient {
  readonly name = 'e2b-sdk';
  readonly description =
    "e2b (npm) in a node process of its own, against dsec's E2B layer: files.write, 10 × commands.run (a process followed over a Connect stream, `bash -l -c`), files.read; user root";
  readonly image = 'base';
  #child = new LineChild(process.execPath, [NODE_CLIENT]);

  constructor(
    private readonly opts: { url: string; e2bKey: string },
    readonly version: string,
  ) {}

  async open(count: number): Promise<void> {
    await this.#child.ask({ op: 'open', client: this.name, url: this.opts.url, e2bKey: this.opts.e2bKey, count, image: this.image });
  }

  async run(plans: StepPlan[][]): Promise<LoopsOutcome> {
    return (await this.#child.ask({ op: 'run', plans })) as unknown as LoopsOutcome;
  }

  /** The child kills its sandboxes before it exits. */
  async close(): Promise<void> {
    await this.#child.close();
  }
}

/**
 * A runtime's own exec, one process per call: `<tool> exec ID sh -c CMD`; the file is written
 * with `sh -c 'printf %s "$1" > "$2"'` (its content an argument) and read with `cat`.
 */
export class ExecPeerClient implements RolloutClient {
  readonly name: RolloutClientName;
  readonly description: string;
  readonly version: string;
  readonly image = 'busybox';
  #ids: string[] = [];
  #targets: StepTarget[] = [];

  constructor(private readonly peer: Peer) {
    this.name = `${peer.name} exec` as RolloutClientName;
    this.description =
      `${peer.name === 'crun' ? 'raw ' : ''}\`${peer.name} exec ID sh -c CMD\` per command, the write as \`sh -c 'printf %s "$1" > "$2"'\`, ` +
      'the read as `cat`: a process per call, started from the bench';
    this.version = peer.version;
  }

  async open(count: number): Promise<void> {
    const made: string[] = [];
    try {
      await pool(count, CREATES_IN_FLIGHT, async () => void made.push(await this.peer.create()));
    } finally {
      this.#ids.push(...made);
    }
    this.#targets = this.#ids.map((id) => ({
      write: async (path, content) => void (await this.peer.exec(id, ['sh', '-c', 'printf %s "$1" > "$2"', 'sh', content, path])),
      // The peer throws on a non-zero exit and drops stdout: `; exit 0` (a builtin) keeps a failing test run's answer.
      run: (cmd) => this.peer.exec(id, ['sh', '-c', `${cmd}; exit 0`]),
      read: (path) => this.peer.exec(id, ['cat', path]),
    }));
  }

  /** The loops run here: each call is a process of its own, and dsec is idle meanwhile. */
  run(plans: StepPlan[][]): Promise<LoopsOutcome> {
    return runLoops(this.#targets, plans);
  }

  async close(): Promise<void> {
    const all = this.#ids;
    this.#ids = [];
    this.#targets = [];
    await pool(all.length, CREATES_IN_FLIGHT, async (i) => void (await this.peer.remove(all[i]!).catch(() => undefined)));
  }
}
