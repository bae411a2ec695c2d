import { ApiError } from '../../api-error.js';
import { nodeMemory, type NodeMemory } from '../../host/node-memory.js';

/** The edge's memory floor: a create is refused below it, so the sandboxes already there keep their memory. */
export interface MemoryAdmission {
  /** Refuse while less than this is available (MemAvailable, or a bounding memory cgroup's headroom); 0: never. */
  minAvailableBytes: number;
  /** Refuse while PSI memory `full avg10` is at or above this percentage (the node thrashes); 0: never. */
  maxFullPressure: number;
}

export const MEMORY_PRESSURE_HINT = 'end or pause sandboxes on this node, or create on another node, and retry';

/**
 * Why the node cannot take another sandbox now (503 NODE_MEMORY_PRESSURE, `details.admission`:
 * the control plane then tries another edge), or undefined when it can. An idle sandbox costs
 * little (about 1.5 MiB of kernel memory), but one more on a node that has run out of memory
 * would OOM-kill commands of the sandboxes already there.
 */
export function memoryAdmissionError(edgeId: string, admission: MemoryAdmission, mem: NodeMemory = nodeMemory()): ApiError | undefined {
  const details = {
    edge: edgeId,
    availableMiB: Math.floor(mem.availableBytes / 2 ** 20),
    minAvailableMiB: Math.floor(admission.minAvailableBytes / 2 ** 20),
    source: mem.source,
    ...(mem.fullAvg10 !== undefined ? { fullAvg10: mem.fullAvg10 } : {}),
    admission: true,
  };
  if (admission.minAvailableBytes > 0 && mem.availableBytes < admission.minAvailableBytes) {
    return new ApiError(
      'NODE_MEMORY_PRESSURE',
      `edge ${edgeId}: ${details.availableMiB} MiB of memory available (${mem.source}), below the ${details.minAvailableMiB} MiB a create needs (--min-available-memory-mib); ${MEMORY_PRESSURE_HINT}`,
      details,
    );
  }
  if (admission.maxFullPressure > 0 && mem.fullAvg10 !== undefined && mem.fullAvg10 >= admission.maxFullPressure) {
    return new ApiError(
      'NODE_MEMORY_PRESSURE',
      `edge ${edgeId}: the node is thrashing, all its tasks waited on memory ${mem.fullAvg10}% of the last 10 s (PSI full avg10), at or above the ${admission.maxFullPressure}% a create allows (--max-memory-pressure); ${MEMORY_PRESSURE_HINT}`,
      details,
    );
  }
  return undefined;
}
