import { Edge, type EdgeOptions } from '../edge/backends/container/container-backend.js';
import { BackendDispatch } from '../edge/backends/dispatch.js';
import { VmBackend } from '../edge/backends/vm/vm-backend.js';
import { FnCalls } from '../edge/backends/fncall/fn-calls.js';

/** One node's backends: the container Edge, the VM backend (when the guest is built), and the dispatch that is the node's EdgeApi. */
export interface NodeBackends {
  edge: Edge;
  vms: VmBackend | undefined;
  fn: FnCalls;
  api: BackendDispatch;
  /** VMs first: the edge's start reconciles the layer cache, which must see the VMs' layers. */
  start(): Promise<void>;
  shutdown(opts?: { killAll?: boolean }): Promise<void>;
}

/** Wires a node's backends; `dsec up` and `dsec edge` both build their node with it. */
export function makeNodeBackends(opts: Omit<EdgeOptions, 'layerInUse'>): NodeBackends {
  // The edge's layer cache asks the VM backend, which needs that cache: tied through this box.
  const box: { vms?: VmBackend | undefined } = {};
  const edge = new Edge({ ...opts, layerInUse: (d) => box.vms?.layerInUse(d) ?? false });
  const setup = VmBackend.create({
    nodeDir: opts.nodeDir,
    layerCache: edge.layerCache,
    links: edge.links,
    blobs: opts.blobs,
    log: opts.log.child({ backend: 'vm' }),
  });
  const vms = (box.vms = setup.backend);
  if (setup.missing) opts.log.warn(`microVM/VM sandboxes are off: ${setup.missing}`);
  const fn = new FnCalls(edge, { log: opts.log.child({ backend: 'fncall' }) });
  return {
    edge,
    vms,
    fn,
    api: new BackendDispatch(edge, vms, fn),
    async start() {
      await vms?.start();
      await edge.start();
      await fn.start();
    },
    async shutdown(o = {}) {
      // Workers hold nothing worth keeping: they go whether or not the sandboxes stay.
      await fn.shutdown();
      await vms?.shutdown(o);
      await edge.shutdown(o);
    },
  };
}
