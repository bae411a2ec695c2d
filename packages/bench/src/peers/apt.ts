import { existsSync, rmSync, writeFileSync } from 'node:fs';
import { runTool } from 'dsec/host';

const POLICY_RC_D = '/usr/sbin/policy-rc.d';

/** Whether dpkg has `pkg` installed. */
export async function installed(pkg: string): Promise<boolean> {
  const r = await runTool('dpkg-query', ['-W', '-f=${Status}', pkg]);
  return r.code === 0 && r.stdout.includes('install ok installed');
}

/**
 * Installs Debian packages that are missing (idempotent: nothing runs when all are there).
 * Recommends are left out (podman's pull in dbus and systemd). Package scripts must not start
 * services (docker.io's would start a system dockerd): a policy-rc.d saying "no" is in place
 * while apt runs, unless the host has one already.
 */
export async function ensurePackages(pkgs: string[], say: (m: string) => void): Promise<void> {
  const missing: string[] = [];
  for (const p of pkgs) if (!(await installed(p))) missing.push(p);
  if (missing.length === 0) return;
  say(`installing ${missing.join(' ')} with apt-get`);
  const ownPolicy = !existsSync(POLICY_RC_D);
  if (ownPolicy)
    writeFileSync(POLICY_RC_D, '#!/bin/sh\n# dsec bench: no service starts during its apt-get install\nexit 101\n', { mode: 0o755 });
  try {
    const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
    const install = (): ReturnType<typeof runTool> =>
      runTool('apt-get', ['install', '-y', '-qq', '--no-install-recommends', ...missing], { env });
    let r = await install();
    if (r.code !== 0) {
      // A fresh host has no package lists yet.
      const u = await runTool('apt-get', ['update', '-qq'], { env });
      if (u.code !== 0) throw new Error(`apt-get update failed: ${tail(u.stderr)}`);
      r = await install();
    }
    if (r.code !== 0) throw new Error(`apt-get install ${missing.join(' ')} failed: ${tail(r.stderr || r.stdout)}`);
  } finally {
    if (ownPolicy) rmSync(POLICY_RC_D, { force: true });
  }
}

function tail(text: string, lines = 8): string {
  return text.trim().split('\n').slice(-lines).join('\n');
}
