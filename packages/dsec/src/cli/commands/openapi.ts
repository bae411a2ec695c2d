import { readFileSync, writeFileSync } from 'node:fs';
import type { Command } from 'commander';
import { generateOpenApi } from '../../control/openapi.js';

export function registerOpenApiCommand(program: Command): void {
  program
    .command('openapi')
    .description('print the OpenAPI document; --write FILE updates it, --check FILE fails when FILE has drifted from the schemas')
    .option('--write <file>', 'write the document to FILE')
    .option('--check <file>', 'exit 1 when FILE differs from the generated document')
    .action(async (f: { write?: string; check?: string }) => {
      const text = JSON.stringify(await generateOpenApi(), null, 2) + '\n';
      if (f.check) {
        let committed = '';
        try {
          committed = readFileSync(f.check, 'utf8');
        } catch {
          // missing counts as drift
        }
        if (committed !== text) {
          process.stderr.write(`${f.check} has drifted from the API schemas: run \`./dsec openapi --write ${f.check}\` and commit it\n`);
          process.exitCode = 1;
        } else process.stdout.write(`${f.check} matches the API schemas\n`);
      } else if (f.write) writeFileSync(f.write, text);
      else process.stdout.write(text);
    });
}
