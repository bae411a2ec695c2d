import type { Command } from 'commander';

export function registerBenchCommands(program: Command): void {
  program.command('bench').description('benchmarks side by side with raw crun, podman and docker (see docs/BENCHMARKS.md)');
}
