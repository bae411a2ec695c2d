/** `sha256:<64 hex>`: the content address of an EROFS layer blob. */
export type LayerDigest = `sha256:${string}`;

const DIGEST = /^sha256:[0-9a-f]{64}$/;

export function isLayerDigest(s: string): s is LayerDigest {
  return DIGEST.test(s);
}
