import { randomBytes } from 'node:crypto';
import { DEFAULT_MAX_OUTPUT_BYTES, type ProcessInfo, type StartProcessRequest } from '@dsec/sdk/schema';
import type { ProcessTable } from '../../shared/process-table.js';
import { processSpecFor, type ExecTarget } from './exec-target.js';
import { SandboxProcess } from './sandbox-process.js';

/** A background process started in a container sandbox (by dsec-spawn, enter-child.ts), tracked in its ProcessTable. */
export function startProcess(table: ProcessTable, target: ExecTarget, req: StartProcessRequest): ProcessInfo {
  const tag = randomBytes(6).toString('hex');
  const maxOutputBytes = req.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
  const reservation = table.reserveOutput(maxOutputBytes); // before it starts: a refusal runs nothing
  let proc: SandboxProcess;
  try {
    proc = new SandboxProcess(target, processSpecFor(target, req.cmd, { cwd: req.cwd, env: req.env, writablePaths: req.writablePaths }), {
      stdin: req.stdin ?? false,
      maxOutputBytes,
      timeoutMs: req.timeoutMs,
      tag,
    });
  } catch (err) {
    reservation.release();
    throw err;
  }
  return table.add(req.cmd, proc, tag, reservation);
}
