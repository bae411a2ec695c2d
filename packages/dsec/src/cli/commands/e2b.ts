import type { Command } from 'commander';
import { Connection } from '@dsec/sdk';

/** `dsec e2b-key`: mints an `e2b_` key on the running server, for E2B code pointed at dsec (docs/E2B.md). */
export function registerE2bCommands(program: Command): void {
  program
    .command('e2b-key')
    .description("mint an API key in E2B's shape (e2b_…) for code using E2B's SDK against this server; prints the E2B_* settings")
    .option('--name <name>', 'a name to remember the key by', 'e2b')
    .action(async (f: { name: string }) => {
      const conn = new Connection();
      const res = await conn.request('POST', '/v1/e2b/keys', { json: { name: f.name } });
      const { key } = (await res.json()) as { id: string; key: string };
      process.stdout.write(`E2B_API_URL=${conn.url}\nE2B_SANDBOX_URL=${conn.url}\nE2B_API_KEY=${key}\n`);
    });
}
