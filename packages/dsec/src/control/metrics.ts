/**
 * Counters for /metrics (Prometheus text format). The control plane counts where the work happens
 * (create, exec), so every way in is counted: the create route, fork, replay, and streamed and
 * session commands as well as buffered ones.
 */
export class Metrics {
  creates = 0;
  createMsTotal = 0;
  execs = 0;
  execMsTotal = 0;
  observeCreate(ms: number): void {
    this.creates++;
    this.createMsTotal += ms;
  }
  observeExec(ms: number): void {
    this.execs++;
    this.execMsTotal += ms;
  }
}
