import { randomFillSync } from 'node:crypto';

/**
 * 64 random bits from a pool refilled 512 draws at a time: a call to the system's random source per
 * draw was 2 % of the control plane's time placing a batch, and per request 2 % of its time serving
 * single creates (dsec bench cluster's profiles), as crypto.randomUUID pools its bytes for the same
 * reason. Sandbox ids (control/sandbox-ids.ts) and request ids (http/request-log.ts) draw from it;
 * each draw's bytes are used once.
 */
const POOL = Buffer.alloc(8 * 512);
let poolOffset = POOL.length;

export function randomBits64(): bigint {
  if (poolOffset === POOL.length) {
    randomFillSync(POOL);
    poolOffset = 0;
  }
  const bits = POOL.readBigUInt64BE(poolOffset);
  poolOffset += 8;
  return bits;
}
