import type { IncomingMessage } from 'node:http';
import type { FastifyPluginAsync } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { createE2bApiKey } from '../api-keys.js';
import { SYSTEM } from '../service/callers.js';
import type { ControlPlane } from '../control-plane.js';
import { errorResponses as errors } from '../routes/error-responses.js';
import type { StateStore } from '../state-store.js';
import { registerControlRoutes } from './control-routes.js';
import { FilesystemService } from './filesystem-service.js';
import { ProcessService } from './process-service.js';
import { registerSandboxRoutes } from './sandbox-routes.js';
import { SANDBOX_PREFIX } from './sandbox-prefix.js';
import { SandboxUsers } from './sandbox-users.js';
import { access } from '../../http/access.js';

/**
 * The dispatch E2B's SDK relies on when E2B_SANDBOX_URL points at dsec: every sandbox request
 * carries `E2b-Sandbox-Id`, so such a request is routed to the sandbox side, and anything else
 * keeps its URL. A signed file URL (`downloadUrl` / `uploadUrl`) is fetched by whoever it was
 * handed to, with no header: `/files?…&signature=…` goes to the sandbox side too, where the
 * signature names the sandbox (sandbox-access.ts). A URL that already starts with the sandbox
 * prefix but lacks the header is sent nowhere, so the sandbox side is reachable only as E2B
 * reaches it.
 */
export function e2bRewriteUrl(req: IncomingMessage): string {
  const url = req.url ?? '/';
  if (req.headers['e2b-sandbox-id'] !== undefined) return `${SANDBOX_PREFIX}${url.startsWith('/') ? url : `/${url}`}`;
  if (url.startsWith('/files?') && new URLSearchParams(url.slice('/files?'.length)).has('signature')) return `${SANDBOX_PREFIX}${url}`;
  if (url === SANDBOX_PREFIX || url.startsWith(`${SANDBOX_PREFIX}/`) || url.startsWith(`${SANDBOX_PREFIX}?`)) return `/__no-route${url}`;
  return url;
}

/** How often in-memory E2B state of sandboxes that are gone is dropped. */
const STATE_SWEEP_MS = 60_000;

const E2bKey = Type.Object({
  id: Type.String(),
  key: Type.String({ description: 'An `e2b_` key: give it to E2B code as E2B_API_KEY. Shown once; only its hash is stored.' }),
});

/**
 * E2B compatibility: E2B's control-plane REST API and its sandbox-side services (envd) on dsec's
 * own port, over the control plane's services, plus `POST /v1/e2b/keys` to mint E2B-shaped keys.
 */
export function e2bRoutes(deps: { control: ControlPlane; store: StateStore }): FastifyPluginAsync {
  const { control, store } = deps;
  return async (app) => {
    const users = new SandboxUsers(control);
    const processes = new ProcessService(control, users);
    const files = new FilesystemService(control, users);
    const forget = (id: string): void => {
      users.forget(id);
      processes.forget(id);
      files.forget(id);
    };
    // Sandboxes also end without the E2B API (dsec's DELETE, a TTL, a failed edge): their
    // in-memory E2B state (pids, PTYs, watchers, users) is dropped once they are gone.
    const sweepOnce = async (): Promise<void> => {
      const known = new Set([...users.sandboxes(), ...processes.sandboxes(), ...files.sandboxes()]);
      for (const id of known) {
        let status: string | undefined;
        try {
          status = (await control.sandboxes.get(SYSTEM, id)).status;
        } catch {
          status = undefined;
        }
        if (status !== 'running' && status !== 'paused') forget(id);
      }
    };
    let sweeping = false;
    const sweep = setInterval(() => {
      if (sweeping) return;
      sweeping = true;
      void sweepOnce().finally(() => (sweeping = false));
    }, STATE_SWEEP_MS);
    sweep.unref();
    app.addHook('onClose', async () => clearInterval(sweep));

    await app.register(async (scope) => {
      registerControlRoutes(scope, { control, store, onKill: forget });
    });
    await app.register(async (scope) => {
      registerSandboxRoutes(scope, { control, files, services: [processes.service(), files.service()] });
    });
    await app.register(async (base) => {
      base.withTypeProvider<TypeBoxTypeProvider>().post(
        '/v1/e2b/keys',
        {
          config: access.key,
          schema: {
            tags: ['e2b'],
            summary:
              "Mint an API key in E2B's shape (e2b_…) for the caller's project (never an admin key), for code that uses E2B's SDK against this server (see docs/E2B.md)",
            body: Type.Object({ name: Type.Optional(Type.String({ maxLength: 128 })) }, { additionalProperties: false }),
            response: { 201: E2bKey, ...errors },
          },
        },
        // A key of the caller's own project, never an admin one: minting it needs no admin key.
        // It is the minting key's: revoking that key revokes it too.
        async (req, reply) =>
          reply
            .status(201)
            .send(await createE2bApiKey(store, req.body.name ?? 'e2b', { project: req.caller.project, admin: false }, req.caller.keyId)),
      );
    });
  };
}
