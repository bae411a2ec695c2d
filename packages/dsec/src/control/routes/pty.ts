import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { PtyQuery, SandboxIdParams } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { ControlPlane } from '../control-plane.js';
import { access } from '../../http/access.js';

/**
 * An interactive terminal over a WebSocket. Client → server: binary frames are keystrokes;
 * text frames are JSON `{type:"resize",cols,rows}` or `{type:"input",data}`. Server → client:
 * binary frames of terminal output, then a text frame `{type:"exit",exitCode}` and close.
 * Closing the socket kills the command. Registered in the scope that has @fastify/websocket.
 */
export function ptyRoutes(deps: { control: ControlPlane }): FastifyPluginAsync {
  const { control } = deps;
  return async (base) => {
    const app = base.withTypeProvider<TypeBoxTypeProvider>();
    app.get(
      '/v1/sandboxes/:id/pty',
      {
        config: access.key,
        websocket: true,
        schema: {
          tags: ['exec'],
          summary: 'Interactive terminal (WebSocket upgrade): binary frames in and out; text {type:resize,cols,rows}',
          params: SandboxIdParams,
          querystring: PtyQuery,
        },
      },
      async (socket, req) => {
        const { id } = req.params;
        // Keystrokes sent while the edge is still opening the terminal (a VM guest's agent, a
        // remote edge) are queued, not dropped: the client may type as soon as the socket opens.
        const early: [Buffer, boolean][] = [];
        const queue = (msg: Buffer, isBinary: boolean): void => void early.push([msg, isBinary]);
        socket.on('message', queue);
        let proc;
        try {
          proc = await control.exec.openTerminal(
            req.caller,
            id,
            { cmd: req.query.cmd, cols: req.query.cols ?? 80, rows: req.query.rows ?? 24, cwd: req.query.cwd },
            { cmd: req.query.cmd ?? [] },
          );
        } catch (err) {
          const e = err instanceof ApiError ? err : new ApiError('INTERNAL', (err as Error).message);
          socket.send(JSON.stringify({ type: 'error', error: { code: e.code, message: e.message } }));
          socket.close(1011, e.code);
          return;
        }
        const p = proc;
        p.onData((data) => {
          if (socket.readyState === socket.OPEN) socket.send(data);
        });
        const onMessage = (msg: Buffer, isBinary: boolean): void => {
          if (isBinary) return p.write(msg);
          try {
            const m = JSON.parse(msg.toString('utf8')) as { type?: string; cols?: number; rows?: number; data?: string };
            if (m.type === 'resize' && Number.isInteger(m.cols) && Number.isInteger(m.rows))
              p.resize(Math.min(Math.max(m.cols!, 1), 1000), Math.min(Math.max(m.rows!, 1), 1000));
            else if (m.type === 'input' && typeof m.data === 'string') p.write(m.data);
          } catch {
            // not JSON: ignore
          }
        };
        socket.off('message', queue);
        for (const [msg, isBinary] of early.splice(0)) onMessage(msg, isBinary);
        socket.on('message', onMessage);
        socket.on('close', () => p.kill());
        if (socket.readyState !== socket.OPEN) p.kill(); // the client left while it was opening
        const exitCode = await p.exit;
        if (socket.readyState === socket.OPEN) {
          socket.send(JSON.stringify({ type: 'exit', exitCode }));
          socket.close(1000, 'exited');
        }
      },
    );
  };
}
