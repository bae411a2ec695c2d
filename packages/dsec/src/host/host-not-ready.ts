/**
 * The host cannot run what was asked (a check failed, a data dir or an edge id is taken, crun's
 * state is unreadable): the message says what to do, so the CLI prints it as one line, without a
 * stack trace. Thrown from any layer, so it lives at the floor.
 */
export class HostNotReadyError extends Error {
  override readonly name: string = 'HostNotReadyError';
}
