import { createHmac, timingSafeEqual } from 'node:crypto';

/**
 * The edge ↔ guest agent framing (see README.md in this folder): [u32 BE header length]
 * [u32 BE payload length][JSON header][payload]. The guest is untrusted: a frame over the limits
 * below ends the connection rather than growing a buffer without bound.
 */
export const MAX_HEADER_BYTES = 64 * 1024;
export const MAX_PAYLOAD_BYTES = 64 * 1024 * 1024;

export type AgentHeader = Record<string, unknown> & { id: number };

export interface AgentFrame {
  header: AgentHeader;
  payload: Buffer;
  /** The header's bytes as they came (its MAC covers them: frameMacOk). */
  rawHeader?: Buffer;
}

/** The prefix of a header that carries a MAC: `{"mac":"<64 hex>",` (vm-agent.c's send_frame). */
const MAC_PREFIX = Buffer.from('{"mac":"');
const MAC_HEX = 64;

/**
 * Whether a frame carries HMAC-SHA256(key, header without its mac member || payload), as the
 * guest agent writes every frame once it has the channel's key: only the agent holds the key, so
 * only the agent can write a frame the edge takes (a program in the guest that got onto the port
 * cannot).
 */
export function frameMacOk(key: Buffer, frame: AgentFrame): boolean {
  const raw = frame.rawHeader;
  const rest = MAC_PREFIX.length + MAC_HEX;
  if (
    !raw ||
    raw.length < rest + 3 ||
    !raw.subarray(0, MAC_PREFIX.length).equals(MAC_PREFIX) ||
    raw[rest] !== 0x22 ||
    raw[rest + 1] !== 0x2c
  )
    return false;
  const claimed = Buffer.from(raw.subarray(MAC_PREFIX.length, rest).toString('latin1'), 'hex');
  if (claimed.length !== 32) return false;
  const mac = createHmac('sha256', key)
    .update('{')
    .update(raw.subarray(rest + 2))
    .update(frame.payload)
    .digest();
  return timingSafeEqual(mac, claimed);
}

export function encodeFrame(header: AgentHeader, payload: Buffer = EMPTY): Buffer {
  const h = Buffer.from(JSON.stringify(header));
  const pre = Buffer.alloc(8);
  pre.writeUInt32BE(h.length, 0);
  pre.writeUInt32BE(payload.length, 4);
  return Buffer.concat([pre, h, payload]);
}

export class FrameError extends Error {
  override readonly name = 'FrameError';
}

/** Accumulates bytes from the port and yields whole frames. */
export class FrameDecoder {
  #buf: Buffer = EMPTY;

  push(chunk: Buffer): AgentFrame[] {
    this.#buf = this.#buf.length ? Buffer.concat([this.#buf, chunk]) : chunk;
    const out: AgentFrame[] = [];
    while (this.#buf.length >= 8) {
      const hl = this.#buf.readUInt32BE(0);
      const pl = this.#buf.readUInt32BE(4);
      if (hl === 0 || hl > MAX_HEADER_BYTES || pl > MAX_PAYLOAD_BYTES)
        throw new FrameError(`bad frame from the guest agent (header ${hl} B, payload ${pl} B)`);
      if (this.#buf.length < 8 + hl + pl) break;
      let header: unknown;
      try {
        header = JSON.parse(this.#buf.subarray(8, 8 + hl).toString('utf8'));
      } catch {
        throw new FrameError('unparseable frame header from the guest agent');
      }
      if (typeof header !== 'object' || header === null || typeof (header as { id?: unknown }).id !== 'number') {
        throw new FrameError('frame header without an id from the guest agent');
      }
      out.push({
        header: header as AgentHeader,
        payload: Buffer.from(this.#buf.subarray(8 + hl, 8 + hl + pl)),
        rawHeader: Buffer.from(this.#buf.subarray(8, 8 + hl)),
      });
      this.#buf = this.#buf.subarray(8 + hl + pl);
    }
    return out;
  }
}

const EMPTY = Buffer.alloc(0);
