import type { SandboxInfo } from '@dsec/sdk/schema';

/**
 * A sandbox's record for the store's tests: a running busybox container on edge `local`, created
 * 2025-01-01, with `extra` over it. Built loosely (cast) so the tests do not break each time
 * SandboxInfo gains a field; the fields newer schemas require (layers, onExpiry, lastActivityAt)
 * are filled in too, lastActivityAt at its creation.
 */
export function sandboxRow(id: string, extra: Record<string, unknown> = {}): SandboxInfo {
  const createdAt = (extra['createdAt'] as string | undefined) ?? '2025-01-01T00:00:00.000Z';
  return {
    id,
    edge: 'local',
    backend: 'container',
    status: 'running',
    image: 'busybox',
    imageId: `sha256:${'0'.repeat(64)}`,
    resources: { cpu: 1, memoryMiB: 64, pids: 64 },
    labels: {},
    layers: [],
    onExpiry: 'stop',
    lastActivityAt: createdAt,
    createdAt,
    ...extra,
  } as unknown as SandboxInfo;
}
