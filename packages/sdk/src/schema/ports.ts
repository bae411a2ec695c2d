import { Type, type Static } from 'typebox';

/** A TCP port in a sandbox. */
export const PortNumber = Type.Integer({ minimum: 1, maximum: 65535, description: 'A TCP port inside the sandbox (its own loopback).' });

export const SandboxPortParams = Type.Object({
  id: Type.String({ minLength: 1, maxLength: 100 }),
  port: PortNumber,
});

/** The longest a signed port link may live. */
export const MAX_PORT_LINK_SECONDS = 86_400;

export const PortLinkRequest = Type.Object(
  {
    port: PortNumber,
    ttlSeconds: Type.Optional(
      Type.Integer({
        minimum: 10,
        maximum: MAX_PORT_LINK_SECONDS,
        default: 3600,
        description: 'How long the link works. It also stops working when the sandbox is killed.',
      }),
    ),
  },
  { additionalProperties: false },
);
export type PortLinkRequest = Static<typeof PortLinkRequest>;

export const PortLink = Type.Object({
  url: Type.String({
    description:
      'Opens the port without an API key (for a browser): `<port-link origin>/v1/port-links/<token>/`, on an origin of its own (DSEC_PORTS_LISTEN), never the API origin; paths below it go to the same path in the sandbox.',
  }),
  port: PortNumber,
  expiresAt: Type.String({ description: 'ISO 8601 time after which the link answers 401.' }),
});
export type PortLink = Static<typeof PortLink>;

/** The longest one port wait may take (a caller waiting longer asks again). */
export const MAX_PORT_WAIT_MS = 300_000;

export const PortWaitRequest = Type.Object(
  {
    port: PortNumber,
    timeoutMs: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_PORT_WAIT_MS,
        default: 30_000,
        description: 'How long to wait for something to accept connections on the port; then 504 PORT_WAIT_TIMEOUT.',
      }),
    ),
  },
  { additionalProperties: false },
);
export type PortWaitRequest = Static<typeof PortWaitRequest>;

export const PortWaitResult = Type.Object({
  port: PortNumber,
  waitedMs: Type.Number({ description: 'How long it took until a connection to the port was accepted.' }),
});
export type PortWaitResult = Static<typeof PortWaitResult>;
