import { chmodSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { runToolOrThrow } from '../../host/run-tool.js';
import type { BuiltImage, Progress } from '../../image/builders/builder.js';
import { buildDebianImage } from '../../image/builders/debian.js';
import type { ImageStore } from '../../image/image-store.js';

/** The image E2B's SDK asks for when code names no template. */
export const BASE_TEMPLATE = 'base';

/** Packages over Debian minbase (which already has bash, coreutils and util-linux's setpriv). */
const PACKAGES = ['python3', 'sudo'];
/** Bump when the customisation below changes: it is part of the build's cache key. */
const CUSTOMIZE_VERSION = 'e2b-base-1';

/**
 * What E2B's `base` template offers code that runs in it: a user `user` (uid 1000, home
 * /home/user, bash) with passwordless sudo, python3 and the usual coreutils. Built with the
 * Debian builder, so it is cached like any Debian image (same packages, same key, no rebuild).
 */
export async function buildE2bBaseImage(store: ImageStore, opts: { name?: string; progress?: Progress } = {}): Promise<BuiltImage> {
  return buildDebianImage(store, {
    name: opts.name ?? BASE_TEMPLATE,
    packages: PACKAGES,
    ...(opts.progress ? { progress: opts.progress } : {}),
    customize: {
      key: CUSTOMIZE_VERSION,
      run: async (root) => {
        opts.progress?.('adding user `user` (uid 1000, home /home/user, passwordless sudo)');
        await runToolOrThrow('chroot', [root, 'useradd', '--create-home', '--shell', '/bin/bash', '--uid', '1000', '--user-group', 'user']);
        mkdirSync(join(root, 'etc/sudoers.d'), { recursive: true });
        const sudoers = join(root, 'etc/sudoers.d/user');
        writeFileSync(sudoers, 'user ALL=(ALL:ALL) NOPASSWD: ALL\n');
        chmodSync(sudoers, 0o440);
      },
    },
  });
}
