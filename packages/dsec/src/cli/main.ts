#!/usr/bin/env node
import { Command } from 'commander';
import { DsecError } from '@dsec/sdk';
import { OptionsError } from '../config/options.js';
import { HostNotReadyError } from '../host/host-not-ready.js';
import { BuildInputError } from '../image/builders/builder.js';
import { DockerfileError } from '../image/dockerfile/parser.js';
import { ImportError } from '../image/oci-import.js';
import { UsageError } from './args.js';
import { registerBenchCommands } from './commands/bench.js';
import { registerDemoCommand } from './commands/demo.js';
import { registerE2bCommands } from './commands/e2b.js';
import { registerImageCommands } from './commands/images.js';
import { registerSandboxCommands } from './commands/sandboxes.js';
import { registerServerCommands } from './commands/server.js';
import { registerClusterCommands } from './commands/cluster.js';
import { registerOpenApiCommand } from './commands/openapi.js';
import { registerPoolCommands } from './commands/pools.js';
import { registerPortCommands } from './commands/ports.js';
import { registerTopCommand } from './commands/top.js';
import { registerProjectCommands } from './commands/projects.js';
import { registerVolumeCommands } from './commands/volumes.js';

const program = new Command('dsec')
  .description(
    'dsec: elastic sandboxes for agent RL. Server commands need root; client commands read DSEC_URL/DSEC_API_KEY or DATA_DIR/client.json.',
  )
  .showHelpAfterError()
  // Lets `exec` hand every option after the sandbox id to the command (passThroughOptions).
  .enablePositionalOptions();
registerServerCommands(program);
registerClusterCommands(program);
registerSandboxCommands(program);
registerPoolCommands(program);
registerPortCommands(program);
registerVolumeCommands(program);
registerImageCommands(program);
registerDemoCommand(program);
registerBenchCommands(program);
registerTopCommand(program);
registerOpenApiCommand(program);
registerE2bCommands(program);
registerProjectCommands(program);

try {
  await program.parseAsync(process.argv);
} catch (err) {
  if (err instanceof DsecError) {
    process.stderr.write(`dsec: ${err.message}${err.code ? ` (${err.code})` : ''}\n`);
    const stderr = err.details['stderr'];
    if (typeof stderr === 'string' && stderr) process.stderr.write(`${stderr}\n`);
  } else if (
    err instanceof OptionsError ||
    err instanceof HostNotReadyError ||
    err instanceof UsageError ||
    err instanceof BuildInputError ||
    err instanceof DockerfileError ||
    err instanceof ImportError
  ) {
    // The user's mistake or the host's state: the message says what to do; a stack trace would not.
    process.stderr.write(`dsec: ${err.message}\n`);
  } else {
    process.stderr.write(`dsec: ${(err as Error).stack ?? String(err)}\n`);
  }
  process.exitCode = 1;
}
