/**
 * Entry point `dsec/cluster`, for the cluster benchmark (`packages/bench`) and for tests that
 * need edges without crun: the control plane's side of the edge protocol (its HTTP client, the
 * route prefix, the protocol version, the request type, the API error it throws) and the
 * SIMULATED edge (edge/simulated/) that speaks it, in-process or N of them in a child process.
 */
import { fileURLToPath } from 'node:url';

export { ApiError } from '../api-error.js';
export { HttpEdgeClient } from '../control/edges/http-edge-client.js';
export type { EdgeCreateRequest } from '../edge/protocol/edge-api.js';
export { EDGE_PREFIX, EDGE_PROTOCOL_VERSION } from '../edge/protocol/schemas.js';
export {
  serveSimulatedEdge,
  SIMULATED_NODE,
  SimulatedEdge,
  startSimulatedEdge,
  type RunningSimulatedEdge,
  type SimulatedNode,
} from '../edge/simulated/simulated-edge.js';

/** `node <this> --join URL --count N --id-prefix P --run-dir DIR`: N simulated edges in a child process (see the file). */
export const SIMULATED_EDGES_MAIN: string = fileURLToPath(new URL('../edge/simulated/simulated-edges-main.js', import.meta.url));
export type { App } from '../http/app.js';
