import { spawn } from 'node:child_process';
import { SECCOMP_BPF_BINARY } from '../../../host/native-helpers.js';
import { signalNumber, ToolError } from '../../../host/run-tool.js';
import type { SeccompProfile } from './seccomp.js';

const EPERM = 1;

/**
 * The profile as dsec-seccomp-bpf reads it (native/seccomp-bpf.c): one line per element, in the
 * profile's order, architectures by libseccomp's names (SCMP_ARCH_X86_64 → x86_64), as crun
 * names them when it compiles the same block.
 */
export function profileLines(profile: SeccompProfile): string {
  const lines = [`default ${profile.defaultAction} ${profile.defaultErrnoRet ?? EPERM}`];
  for (const arch of profile.architectures ?? []) lines.push(`arch ${arch.replace(/^SCMP_ARCH_/, '').toLowerCase()}`);
  for (const rule of profile.syscalls ?? []) {
    const args = (rule.args ?? []).map((a) => `${a.index} ${a.op} ${a.value} ${a.valueTwo ?? 0}`).join(' ');
    for (const name of rule.names) lines.push(`rule ${rule.action} ${rule.errnoRet ?? EPERM} ${name}${args ? ` ${args}` : ''}`);
  }
  return `${lines.join('\n')}\n`;
}

/**
 * Compiles a seccomp profile to the BPF program the kernel loads (libseccomp, as crun does), for
 * crun's `run.oci.seccomp_bpf_data` annotation: done once per edge, where crun would compile the
 * same profile on every create. Throws with the compiler's stderr.
 */
export function compileSeccompProfile(profile: SeccompProfile, binary = SECCOMP_BPF_BINARY): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    // Its output is binary, so not runTool (which collects text).
    const child = spawn(binary, [], { stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', (err) =>
      reject(new ToolError(binary, [], { code: 127, stdout: '', stderr: `${err.message} (run scripts/setup to build it)` })),
    );
    child.on('close', (code, signal) => {
      const status = code ?? 128 + signalNumber(signal);
      const bpf = Buffer.concat(out);
      // A program is whole 8-byte instructions; anything else is not one.
      if (status === 0 && bpf.length > 0 && bpf.length % 8 === 0) resolve(bpf);
      else
        reject(new ToolError(binary, [], { code: status, stdout: '', stderr: stderr || `no BPF program on stdout (${bpf.length} bytes)` }));
    });
    child.stdin.end(profileLines(profile));
  });
}
