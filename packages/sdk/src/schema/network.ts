import { Type, type Static } from 'typebox';

export const NetworkMode = Type.Union([Type.Literal('none'), Type.Literal('allow'), Type.Literal('open')], {
  description:
    'none: loopback only (default). allow: only the listed destinations. open: anywhere except the host, other sandboxes and metadata addresses.',
});

export const NetworkPolicyRequest = Type.Object(
  {
    mode: NetworkMode,
    allow: Type.Optional(
      Type.Array(
        Type.String({ minLength: 1, maxLength: 260, description: 'CIDR, CIDR:port, host or host:port (names resolved when applied).' }),
        { maxItems: 256 },
      ),
    ),
  },
  { additionalProperties: false },
);
export type NetworkPolicyRequest = Static<typeof NetworkPolicyRequest>;

const networkStateFields = {
  mode: NetworkMode,
  allow: Type.Array(Type.Object({ cidr: Type.String(), port: Type.Optional(Type.Integer()) })),
  address: Type.Optional(
    Type.String({ description: "The sandbox's link-local address on its link to the host (kept once made, also under none)." }),
  ),
  gateway: Type.Optional(Type.String()),
};

/** The policy in force on a sandbox, and its link to the host if it has one. */
export const NetworkPolicyState = Type.Object(networkStateFields);
export type NetworkPolicyState = Static<typeof NetworkPolicyState>;

export const NetworkPolicyResult = Type.Object({
  ...networkStateFields,
  appliedMs: Type.Number({ description: 'Time from request to the rules being in force.' }),
});
export type NetworkPolicyResult = Static<typeof NetworkPolicyResult>;
