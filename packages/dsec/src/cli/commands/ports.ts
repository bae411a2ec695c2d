import { createServer, type Socket } from 'node:net';
import type { Command } from 'commander';
import { DsecError, Sandbox } from '@dsec/sdk';
import { UsageError, intArg } from '../args.js';

/**
 * `dsec port-forward ID PORT [LOCAL]`: a local TCP port whose every connection becomes a TCP
 * stream to PORT in the sandbox (SDK `ports.connect()`, over `/v1/sandboxes/{id}/tcp/{port}`),
 * like `kubectl port-forward`: any protocol, not only HTTP.
 */
export function registerPortCommands(program: Command): void {
  program
    .command('port-forward')
    .description(
      'forward a local TCP port to a port in a sandbox (any protocol; the server listens on the sandbox loopback or 0.0.0.0, under any network policy). LOCAL defaults to PORT; 0 picks a free one. Runs until Ctrl-C.',
    )
    .argument('<id>', 'sandbox id')
    .argument('<port>', 'port in the sandbox (1-65535)', intArg(1))
    .argument('[local]', 'local port (default: the same as PORT; 0: any free port)', intArg(0))
    .option('--address <addr>', 'local address to listen on', '127.0.0.1')
    .action(async (id: string, port: number, local: number | undefined, f: { address: string }) => {
      if (port > 65535 || (local !== undefined && local > 65535))
        throw new UsageError('ports are 1-65535 (LOCAL may be 0 for any free port)');
      const sb = await Sandbox.connect(id);
      if (sb.info.status !== 'running')
        throw new UsageError(`sandbox ${id} is ${sb.info.status}: a port can be forwarded only while it runs`);
      const open = new Set<Socket>();
      const server = createServer({ allowHalfOpen: true }, (client) => {
        open.add(client);
        client.once('close', () => open.delete(client));
        client.pause();
        sb.ports.connect(port).then(
          (remote) => {
            remote.pipe(client);
            client.pipe(remote);
            client.resume();
            const down = (): void => {
              client.destroy();
              remote.destroy();
            };
            remote.on('error', down);
            client.on('error', down);
            remote.once('close', () => client.writableEnded || client.destroy());
            client.once('close', () => remote.writableEnded || remote.destroy());
          },
          (err: unknown) => {
            const why = err instanceof DsecError ? `${err.message} (${err.code})` : (err as Error).message;
            process.stderr.write(`dsec: a connection to ${id} port ${port} failed: ${why}\n`);
            client.destroy();
          },
        );
      });
      await new Promise<void>((resolve, reject) => {
        server.once('error', (err: NodeJS.ErrnoException) =>
          reject(
            err.code === 'EADDRINUSE'
              ? new UsageError(`local port ${local ?? port} on ${f.address} is in use: pass another LOCAL port (or 0 for any free one)`)
              : err,
          ),
        );
        server.listen(local ?? port, f.address, () => resolve());
      });
      const addr = server.address() as { address: string; port: number };
      process.stdout.write(`forwarding ${addr.address}:${addr.port} -> ${id} port ${port} (Ctrl-C to stop)\n`);
      await new Promise<void>((resolve) => {
        const stop = (): void => {
          server.close(() => resolve());
          for (const s of open) s.destroy();
        };
        process.once('SIGINT', stop);
        process.once('SIGTERM', stop);
      });
    });
}
