import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { ApiError } from '../../../api-error.js';
import { CGROUP_PARENT } from '../../../host/cgroups.js';
import { NetnsConnectError, NetnsConnector } from '../../../net/netns-connect.js';
import type { LiveSandbox } from './live-sandbox.js';

/** Connections to a container sandbox's own loopback (for the port proxy), made in its network namespace. */
export class ContainerPorts {
  readonly #connector = new NetnsConnector();

  async open(l: LiveSandbox, port: number): Promise<Duplex> {
    const id = l.record.id;
    if (l.record.paused)
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is paused: nothing in it can answer on port ${port}; resume it first`, {
        id,
        status: 'paused',
      });
    let socket: Socket;
    try {
      socket = await this.#connector.connect(l.record.pid ?? 0, `${CGROUP_PARENT}/${id}`, port);
    } catch (err) {
      if (!(err instanceof NetnsConnectError)) throw err;
      if (err.code === 'ECONNREFUSED' || err.code === 'ETIMEDOUT') throw new ApiError('PORT_NOT_LISTENING', err.message, { id, port });
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id}: ${err.message}`, { id });
    }
    // A kill ends the sandbox's connections with it, rather than leaving them to the kernel.
    l.ports.add(socket);
    socket.once('close', () => l.ports.delete(socket));
    return socket;
  }

  async close(): Promise<void> {
    await this.#connector.close();
  }
}
