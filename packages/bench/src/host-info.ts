import { readFileSync } from 'node:fs';
import { cpus, hostname, loadavg, release, totalmem } from 'node:os';
import { runTool } from 'dsec/host';
import { DSEC_VERSION } from 'dsec/runtime';

/** The machine a result was measured on, and exactly how it was asked for. */
export interface HostInfo {
  hostname: string;
  kernel: string;
  os: string;
  cpus: number;
  cpuModel: string;
  memTotalMiB: number;
  /** 1-minute load average when the run started: this host is shared and noisy. */
  loadAverage1m: number;
  node: string;
  dsec: string;
  commandLine: string;
}

function osRelease(): string {
  try {
    return /^PRETTY_NAME="?([^"\n]*)"?/m.exec(readFileSync('/etc/os-release', 'utf8'))?.[1] ?? 'unknown';
  } catch {
    return 'unknown';
  }
}

/** dsec's package version and, in a git checkout, the commit (with "+dirty" for local changes). */
export async function dsecVersion(): Promise<string> {
  const version = DSEC_VERSION;
  const cwd = new URL('.', import.meta.url).pathname;
  const head = await runTool('git', ['rev-parse', '--short', 'HEAD'], { cwd });
  if (head.code !== 0) return version;
  const dirty = (await runTool('git', ['status', '--porcelain', '--untracked-files=no'], { cwd })).stdout.trim() !== '';
  return `${version} (${head.stdout.trim()}${dirty ? '+dirty' : ''})`;
}

export async function hostInfo(commandLine: string): Promise<HostInfo> {
  const cpu = cpus();
  return {
    hostname: hostname(),
    kernel: release(),
    os: osRelease(),
    cpus: cpu.length,
    cpuModel: cpu[0]?.model.trim() ?? 'unknown',
    memTotalMiB: Math.round(totalmem() / (1 << 20)),
    loadAverage1m: Math.round((loadavg()[0] ?? 0) * 100) / 100,
    node: process.version,
    dsec: await dsecVersion(),
    commandLine,
  };
}
