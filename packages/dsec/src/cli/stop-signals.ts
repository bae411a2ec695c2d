/** Where a daemon says it is stopping, and why it could not. */
export interface StopLog {
  info(message: string): void;
  error(obj: object, message: string): void;
}

/**
 * SIGTERM and SIGINT stop a daemon (`dsec up`, `dsec control`, `dsec edge`) through its close(),
 * with the handlers installed before it starts. Whoever waits for its "up" line may stop it at
 * once, and a signal that comes while no handler listens ends the process without close(): an
 * edge left its user-namespace pool's bind mounts, its pid file and its host-wide uid-range claims
 * behind (cluster/migrate.test.ts failed on those now and then: its harness stops an edge as soon
 * as its "joined" line shows). A signal during start-up is kept and acted on as soon as the
 * daemon is up (`running`); a second one ends the process (Node's default).
 */
export function stopOnSignals(what: string): { running(close: () => Promise<void>, log: StopLog): void } {
  let daemon: { close: () => Promise<void>; log: StopLog } | undefined;
  let early: NodeJS.Signals | undefined;
  const stop = (signal: NodeJS.Signals, d: { close: () => Promise<void>; log: StopLog }): void => {
    d.log.info(`${signal}: ${what}`);
    d.close().then(
      () => process.exit(0),
      (err: unknown) => {
        d.log.error({ err }, 'shutdown failed');
        process.exit(1);
      },
    );
  };
  for (const signal of ['SIGTERM', 'SIGINT'] as const)
    process.once(signal, () => {
      if (daemon) stop(signal, daemon);
      else early ??= signal;
    });
  return {
    running(close, log) {
      daemon = { close, log };
      if (early) stop(early, daemon);
    },
  };
}
