/**
 * A busybox image that also has the host's /bin/bash (and the shared libraries it links), so
 * bash sessions can be tested without a Debian mirror. Built through the shared test image
 * helper (one layer, unique cache key).
 */
import { execFileSync } from 'node:child_process';
import { chmodSync, copyFileSync, mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { ImageStore } from '../../../src/image/image-store.js';
import { BUSYBOX_PATH } from '../../../src/image/builders/busybox.js';
import { buildTestImage } from '../../helpers/images.js';

/** Shared libraries a host binary loads, from ldd (absolute paths only). */
function sharedLibraries(binary: string): string[] {
  const out = execFileSync('ldd', [binary], { encoding: 'utf8' });
  const libs: string[] = [];
  for (const line of out.split('\n')) {
    const m = /=>\s*(\/\S+)/.exec(line) ?? /^\s*(\/\S+)\s+\(/.exec(line);
    if (m) libs.push(m[1]!);
  }
  return libs;
}

function copyInto(root: string, hostPath: string, mode = 0o755): void {
  const dest = join(root, hostPath);
  mkdirSync(dirname(dest), { recursive: true });
  copyFileSync(hostPath, dest); // follows symlinks: the image gets the real bytes at the linked name
  chmodSync(dest, mode);
}

/** Builds (or reuses by name) `busybox-bash`: busybox applets, /bin/bash and its libraries. */
export async function buildBusyboxBashImage(store: ImageStore, name = 'busybox-bash'): Promise<void> {
  await buildTestImage(store, name, (root) => {
    for (const d of ['bin', 'sbin', 'usr/bin', 'usr/sbin', 'etc', 'proc', 'sys', 'dev', 'root', 'home', 'var/tmp', 'run', 'tmp']) {
      mkdirSync(join(root, d), { recursive: true });
    }
    chmodSync(join(root, 'tmp'), 0o1777);
    copyInto(root, BUSYBOX_PATH);
    const applets = execFileSync(BUSYBOX_PATH, ['--list-full'], { encoding: 'utf8' });
    for (const applet of applets.split('\n').filter(Boolean)) {
      if (applet === 'bin/busybox' || applet === 'bin/bash') continue;
      const dest = join(root, applet);
      mkdirSync(dirname(dest), { recursive: true });
      try {
        symlinkSync('/bin/busybox', dest);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
    }
    copyInto(root, '/bin/bash');
    for (const lib of sharedLibraries('/bin/bash')) copyInto(root, lib);
    writeFileSync(join(root, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/bash\n');
    writeFileSync(join(root, 'etc/group'), 'root:x:0:\n');
  });
}
