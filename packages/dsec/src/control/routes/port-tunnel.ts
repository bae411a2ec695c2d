import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { SandboxPortParams } from '@dsec/sdk/schema';
import type { ControlPlane } from '../control-plane.js';
import { servePortChannel } from '../../edge/protocol/port-stream.js';
import { access } from '../../http/access.js';

/**
 * A raw TCP stream to a port of a sandbox over a WebSocket (`dsec port-forward`, SDK
 * `sandbox.ports.connect()`), for any protocol, not only HTTP. The framing is the edge
 * protocol's port channel (edge/protocol/port-stream.ts): `{type:"ready"}` or
 * `{type:"error",error}` first, then binary frames both ways, `{type:"end"}` for a half-close.
 * Registered in the scope that has @fastify/websocket.
 */
export function portTunnelRoutes(deps: { control: ControlPlane }): FastifyPluginAsync {
  const { control } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    app.get(
      '/v1/sandboxes/:id/tcp/:port',
      {
        config: access.key,
        websocket: true,
        schema: { tags: ['ports'], summary: 'A TCP stream to a port in the sandbox (WebSocket upgrade)', params: SandboxPortParams },
      },
      async (socket, req) => servePortChannel(socket, () => control.network.openPort(req.caller, req.params.id, req.params.port)),
    );
  };
}
