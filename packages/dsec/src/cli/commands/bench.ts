import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { Command } from 'commander';

/**
 * The benchmark suite is its own package (packages/bench, `@dsec/bench`), built beside dsec and
 * never imported by it (a lint rule holds that). `dsec bench …` runs the bench's own CLI in a
 * child process with the same arguments, located relative to this checkout:
 * dist/src/cli/commands/bench.js → packages/bench/dist/src/main.js.
 */
const BENCH_MAIN = fileURLToPath(new URL('../../../../../bench/dist/src/main.js', import.meta.url));

export function registerBenchCommands(program: Command): void {
  program
    .command('bench')
    .description('benchmarks side by side with raw crun (always), podman and docker; needs root (see docs/BENCHMARKS.md)')
    .usage('<scenario> [options]   (dsec bench --help lists the scenarios)')
    .helpOption(false)
    .allowUnknownOption()
    .allowExcessArguments()
    .passThroughOptions()
    .argument('[args...]')
    .action(async (args: string[]) => {
      process.exitCode = await runBench(args);
    });
}

async function runBench(args: string[]): Promise<number> {
  if (!existsSync(BENCH_MAIN)) {
    process.stderr.write(
      `dsec bench: the benchmark suite is not built (${BENCH_MAIN} is missing). It is the packages/bench workspace ` +
        'of a dsec checkout: run ./scripts/setup (or npm run build) there, then ./dsec bench again.\n',
    );
    return 1;
  }
  const child = spawn(process.execPath, [BENCH_MAIN, 'bench', ...args], { stdio: 'inherit' });
  // Ctrl-C reaches the bench from the terminal (same process group): it cleans up and exits 130,
  // so this process waits for it instead of dying first. A signal sent to this process alone is passed on.
  const onInt = (): void => undefined;
  const forward = (sig: NodeJS.Signals) => (): void => void child.kill(sig);
  const onTerm = forward('SIGTERM');
  const onHup = forward('SIGHUP');
  process.on('SIGINT', onInt).on('SIGTERM', onTerm).on('SIGHUP', onHup);
  try {
    return await new Promise<number>((resolve, reject) => {
      child.once('error', reject);
      child.once('exit', (code, signal) => resolve(code ?? (signal === 'SIGINT' ? 130 : 1)));
    });
  } finally {
    process.off('SIGINT', onInt).off('SIGTERM', onTerm).off('SIGHUP', onHup);
  }
}
