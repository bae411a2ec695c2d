import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { ApiError } from '../../api-error.js';
import { access } from '../../http/access.js';
import type { EdgeApi } from '../protocol/edge-api.js';
import { EDGE_PREFIX } from '../protocol/schemas.js';
import { servePortChannel } from '../protocol/port-stream.js';
import { Id } from './edge-route-schemas.js';

/** A sandbox's WebSocket channels on the edge protocol: a terminal, and a TCP connection to one of its ports. */
export function channelRoutes(edge: EdgeApi): FastifyPluginAsync {
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    const S = `${EDGE_PREFIX}/sandboxes/:id`;
    // --- terminals: binary frames both ways; text frames: resize in; ready (first) or error, then exit, out ---
    app.get(
      `${S}/pty`,
      {
        config: access.cluster,
        websocket: true,
        schema: {
          params: Id,
          querystring: Type.Object({
            cmd: Type.Optional(Type.Array(Type.String())),
            cols: Type.Integer({ minimum: 1, maximum: 1000, default: 80 }),
            rows: Type.Integer({ minimum: 1, maximum: 1000, default: 24 }),
            cwd: Type.Optional(Type.String()),
            env: Type.Optional(Type.String({ description: 'JSON object of environment variables' })),
          }),
        },
      },
      async (socket, req) => {
        let term;
        try {
          const env = req.query.env === undefined ? undefined : (JSON.parse(req.query.env) as Record<string, string>);
          term = await edge.openPty(req.params.id, {
            cmd: req.query.cmd,
            cols: req.query.cols,
            rows: req.query.rows,
            cwd: req.query.cwd,
            env,
          });
        } catch (err) {
          const e = err instanceof ApiError ? err : new ApiError('INTERNAL', (err as Error).message);
          socket.send(JSON.stringify({ type: 'error', error: { code: e.code, message: e.message, details: e.details } }));
          socket.close(1011, e.code);
          return;
        }
        const t = term;
        socket.send(JSON.stringify({ type: 'ready' }));
        t.onData((data) => {
          if (socket.readyState === socket.OPEN) socket.send(data);
        });
        socket.on('message', (msg: Buffer, isBinary: boolean) => {
          if (isBinary) return t.write(msg);
          try {
            const m = JSON.parse(msg.toString('utf8')) as { type?: string; cols?: number; rows?: number };
            if (m.type === 'resize' && Number.isInteger(m.cols) && Number.isInteger(m.rows)) t.resize(m.cols!, m.rows!);
          } catch {
            // not JSON: ignore
          }
        });
        socket.on('close', () => t.kill());
        const exitCode = await t.exit;
        if (socket.readyState === socket.OPEN) {
          socket.send(JSON.stringify({ type: 'exit', exitCode }));
          socket.close(1000, 'exited');
        }
      },
    );

    // --- ports: a TCP connection into the sandbox as a byte stream (framing: protocol/port-stream.ts) ---
    app.get(
      `${S}/ports/:port`,
      {
        config: access.cluster,
        websocket: true,
        schema: { params: Type.Object({ id: Id.properties.id, port: Type.Integer({ minimum: 1, maximum: 65535 }) }) },
      },
      async (socket, req) => servePortChannel(socket, () => edge.openPort(req.params.id, req.params.port)),
    );
  };
}
