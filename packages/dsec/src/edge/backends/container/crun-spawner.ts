import { existsSync } from 'node:fs';
import type { Logger } from 'pino';
import { SPAWN_HELPER_BINARY } from '../../../host/native-helpers.js';
import { ensurePrivateNull } from '../../../host/private-null.js';
import { SpawnHelper } from '../../../host/spawn-helper.js';

/**
 * The resident dsec-spawn that starts crun (and the edge's other tools) without a fork of the
 * edge: `helper`, always made (its close() is safe when it never started), and `spawner`, the
 * same helper when its binary is built, else undefined (crun is then spawned from the edge).
 * `template`: the node's dirs its template mount namespace leaves out.
 */
export function crunSpawner(template: string[], log: Logger): { helper: SpawnHelper; spawner: SpawnHelper | undefined } {
  // crun runs in a copy of the helper's template mount namespace, which leaves out the node's
  // sandboxes and layers (their mounts grow with the node; crun would copy them all per create)
  // and the pooled user namespaces (a copy kept in the template would outlive their removal).
  // The helper starts, and makes it, at first use: after start()'s mounts and doctor's.
  // Its tools' "null" stdio is dsec's own null node, never the host's /dev/null, which crun
  // would chown to a user-namespaced sandbox's root (host/private-null.ts).
  const privateNull = ensurePrivateNull();
  if (privateNull.path === undefined)
    log.warn(
      { why: privateNull.why },
      "crun gets the host's /dev/null as stdio: with user namespaces, each create makes it owned by that sandbox's root (crun 1.8.1)",
    );
  const helper = new SpawnHelper(SPAWN_HELPER_BINARY, {
    ...(privateNull.path ? { nullDevice: privateNull.path } : {}),
    template,
    onCarryFailed: (why) => log.warn({ why }, "crun runs in the edge's own mount namespace (a create there costs more as the node fills)"),
  });
  // Without the helper built (scripts/setup not run since it was added), crun is spawned from here as before.
  const spawner = existsSync(SPAWN_HELPER_BINARY) ? helper : undefined;
  if (!spawner)
    log.warn({ binary: SPAWN_HELPER_BINARY }, 'dsec-spawn is not built; crun is started with a fork of the edge (run scripts/setup)');
  return { helper, spawner };
}
