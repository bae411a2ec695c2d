import type { Command } from 'commander';
import { compileOptions } from '../../config/options.js';
import { runDemo } from '../demo/demo.js';
import { imageServerUrl } from './image-server.js';

export function registerDemoCommand(program: Command): void {
  program
    .command('demo')
    .description(
      'the main job: start dsec if needed (with DSEC_URL set and no --data-dir: on the server it names), build the default image, run 50 sandboxes through an agent-like sequence, report latency, clean up',
    )
    .option('-n, --sandboxes <n>', 'how many sandboxes', '50')
    .option('--data-dir <dir>', 'state directory (env DSEC_DATA_DIR)')
    .option('--json', 'print the report as JSON')
    .action(async (f: { sandboxes: string; dataDir?: string; json?: boolean }) => {
      const opts = compileOptions({ dataDir: f.dataDir, logLevel: 'warn' });
      const report = await runDemo({ options: opts, count: Number(f.sandboxes), json: f.json ?? false, remote: imageServerUrl(f.dataDir) });
      if (f.json) process.stdout.write(JSON.stringify(report, null, 2) + '\n');
      process.exitCode = report.ok ? 0 : 1;
    });
}
