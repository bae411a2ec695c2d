import { Duplex } from 'node:stream';
import { AgentError, type AgentClient } from './agent-client.js';
import type { AgentFrame } from './agent-frames.js';

/**
 * A TCP connection to `port` on the guest's own loopback, relayed by the guest agent over the
 * VM's channel (`connect`, then `data`/`eof` events and `send`/`close` requests): the guest's
 * network and the VM's egress rules are not involved, as a container's port is reached on the
 * loopback of its netns. Rejects with the agent's error (ECONNREFUSED when nothing listens).
 * Bytes from the guest are pushed as they come (the channel carries every call of the VM, so it
 * is never paused for one slow reader).
 */
export function openGuestPort(agent: AgentClient, port: number): Promise<Duplex> {
  return new Promise((resolve, reject) => {
    let stream: Duplex | undefined;
    const open = (): Duplex =>
      new Duplex({
        read() {},
        write(chunk: Buffer, _enc, cb) {
          try {
            agent.write({ op: 'send', id }, chunk);
            cb();
          } catch (err) {
            cb(err as Error);
          }
        },
        final(cb) {
          try {
            agent.write({ op: 'send', id, eof: true });
            cb();
          } catch (err) {
            cb(err as Error);
          }
        },
        destroy(err, cb) {
          agent.release(id);
          try {
            agent.write({ op: 'close', id });
          } catch {
            // the channel is gone, and the guest's socket with the VM
          }
          cb(err);
        },
      });
    const onEvent = (f: AgentFrame): void => {
      const ev = f.header['ev'];
      if (!stream) {
        if (ev === 'ok') {
          stream = open();
          resolve(stream);
          return;
        }
        agent.release(id);
        reject(ev === 'error' ? new AgentError(String(f.header['code'] ?? 'EIO'), String(f.header['message'] ?? 'connect failed')) : new Error(`the VM's agent channel closed: ${String(f.header['message'] ?? '')}`));
        return;
      }
      if (ev === 'data') stream.push(f.payload);
      else if (ev === 'eof') stream.push(null);
      else if (ev === 'closed') stream.destroy(new Error(`the VM's agent channel closed: ${String(f.header['message'] ?? '')}`));
    };
    const id = agent.send('connect', { port }, undefined, onEvent);
  });
}
