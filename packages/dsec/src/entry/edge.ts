/**
 * Entry point `dsec/edge`, for the benchmark's lazy-layer scenario (`packages/bench`,
 * scenarios/lazy.ts): an edge built in-process over a blob source that serves layers by chunk,
 * the thread that serves them, and a layer's chunk index, so lazy start is timed on dsec's own code.
 */
export { Edge } from '../edge/edge.js';
export { HttpBlobSource } from '../edge/node/blob-source.js';
export { BlobServerThread } from '../edge/node/lazy/blob-server-thread.js';
export { computeChunkIndex, DEFAULT_CHUNK_SIZE } from '../image/chunk-index.js';
