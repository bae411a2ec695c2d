/**
 * The TS SDK's and E2B's SDK's side of `dsec bench rollout`, in a node process of its own (a
 * trainer's), spoken to in JSON lines by rollout-child.ts:
 *   {"op": "open", "client": "ts-sdk", "url", "apiKey", "ids": [...], "loginShell"} → {"ok": true}   (connects to sandboxes made by the bench)
 *   {"op": "open", "client": "e2b-sdk", "url", "e2bKey", "count", "image"}    → {"ok": true}   (creates them through E2B's API)
 *   {"op": "run", "plans": [[plan, ...], ...]}                                 → {"wallMs", "clientCpuMs", "outcomes"}
 *   {"op": "close"}                                                            → kills what it created, exits
 * A failed request answers {"error": "..."}.
 */
import { createInterface } from 'node:readline';
import { Sandbox } from '@dsec/sdk';
import { pool } from '../rounds.js';
import { runLoops, type StepPlan, type StepTarget } from './rollout-step.js';

interface OpenRequest {
  op: 'open';
  client: 'ts-sdk' | 'e2b-sdk';
  url: string;
  apiKey?: string;
  e2bKey?: string;
  ids?: string[];
  /** Each command as `/bin/bash -l -c CMD` (as E2B's SDK runs it), not `sh -c CMD`. */
  loginShell?: boolean;
  count?: number;
  image?: string;
}

/** Sandboxes created at once (creates are not what is measured). */
const CREATES_IN_FLIGHT = 8;

let targets: StepTarget[] = [];
let closeAll: () => Promise<void> = async () => {};

async function openTs(req: OpenRequest): Promise<void> {
  const conn = { url: req.url, apiKey: req.apiKey ?? '' };
  const sandboxes = await Promise.all((req.ids ?? []).map((id) => Sandbox.connect(id, conn)));
  targets = sandboxes.map((sb) => ({
    write: async (path, content) => void (await sb.files.write(path, content)),
    run: async (cmd) => (await sb.commands.run(req.loginShell ? ['/bin/bash', '-l', '-c', cmd] : cmd)).stdout,
    read: (path) => sb.files.readText(path),
  }));
}

/** As root: E2B's default user would add a setpriv to every command. */
async function openE2b(req: OpenRequest): Promise<void> {
  const { Sandbox: E2bSandbox, CommandExitError } = await import('e2b');
  const made: InstanceType<typeof E2bSandbox>[] = [];
  closeAll = async () => void (await Promise.allSettled(made.map((sb) => sb.kill())));
  const conn = { apiKey: req.e2bKey, apiUrl: req.url, sandboxUrl: req.url };
  await pool(req.count ?? 0, CREATES_IN_FLIGHT, async () => {
    made.push(await E2bSandbox.create(req.image ?? 'base', { ...conn, timeoutMs: 3_600_000 }));
  });
  const user = { user: 'root' } as const;
  targets = made.map((sb) => ({
    write: async (path, content) => void (await sb.files.write(path, content, user)),
    run: async (cmd) => {
      try {
        return (await sb.commands.run(cmd, user)).stdout;
      } catch (err) {
        // A non-zero exit (a failing test run) is an answer, not a failure to run.
        if (err instanceof CommandExitError) return err.stdout;
        throw err;
      }
    },
    read: (path) => sb.files.read(path, user),
  }));
}

for await (const line of createInterface({ input: process.stdin })) {
  const req = JSON.parse(line) as { op: string; plans?: StepPlan[][] };
  if (req.op === 'close') break;
  let answer: object;
  try {
    if (req.op === 'open') {
      const open = req as OpenRequest;
      await (open.client === 'ts-sdk' ? openTs(open) : openE2b(open));
      answer = { ok: true };
    } else if (req.op === 'run') {
      const cpu = process.cpuUsage();
      const o = await runLoops(targets, req.plans ?? []);
      const used = process.cpuUsage(cpu);
      answer = { ...o, clientCpuMs: (used.user + used.system) / 1000 };
    } else answer = { error: `unknown op ${JSON.stringify(req.op)}` };
  } catch (err) {
    answer = { error: (err as Error).message };
  }
  process.stdout.write(JSON.stringify(answer) + '\n');
}
await closeAll();
// Kept-alive connections would hold the process open.
process.exit(0);
