import { createHash } from 'node:crypto';
import { chmodSync, copyFileSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { runToolOrThrow } from '../../host/run-tool.js';
import { defaultImageConfig, type ImageStore } from '../image-store.js';
import { buildSingleLayerImage, uuidFromKey, type BuiltImage, type Progress } from './builder.js';

/** Debian's busybox-static: one static binary, so the image is a few MB and needs nothing else. */
export const BUSYBOX_PATH = '/bin/busybox';
const BUILDER_VERSION = 'busybox-1';

/** Builds the small image most tests use: busybox with every applet linked, /etc basics. */
export async function buildBusyboxImage(store: ImageStore, opts: { name?: string; progress?: Progress } = {}): Promise<BuiltImage> {
  const progress = opts.progress ?? (() => {});
  const binary = readFileSync(BUSYBOX_PATH);
  const cacheKey = createHash('sha256').update(BUILDER_VERSION).update(binary).digest('hex');
  return buildSingleLayerImage({
    store,
    name: opts.name ?? 'busybox',
    cacheKey,
    progress,
    // Reproducible: the same busybox binary gives the same layer digest on every node.
    erofs: { compression: 'none', reproducible: { timestamp: 0, uuid: uuidFromKey(cacheKey) } },
    config: defaultImageConfig({ cmd: ['/bin/sh'], labels: { 'dsec.builder': 'busybox' } }),
    fill: async (root) => {
      progress('laying out a busybox root filesystem');
      await layOutBusybox(root);
    },
  });
}

/** A busybox root: every applet linked, the usual directories, /etc basics. Other builders start from it. */
export async function layOutBusybox(root: string): Promise<void> {
  for (const d of ['bin', 'sbin', 'usr/bin', 'usr/sbin', 'etc', 'proc', 'sys', 'dev', 'root', 'home', 'var/tmp', 'run']) {
    mkdirSync(join(root, d), { recursive: true });
  }
  mkdirSync(join(root, 'tmp'));
  chmodSync(join(root, 'tmp'), 0o1777);
  chmodSync(join(root, 'root'), 0o700);
  copyFileSync(BUSYBOX_PATH, join(root, 'bin/busybox'));
  chmodSync(join(root, 'bin/busybox'), 0o755);
  const { stdout } = await runToolOrThrow(BUSYBOX_PATH, ['--list-full']);
  for (const applet of stdout.split('\n').filter(Boolean)) {
    if (applet === 'bin/busybox') continue;
    const dest = join(root, applet);
    mkdirSync(dirname(dest), { recursive: true });
    try {
      symlinkSync('/bin/busybox', dest);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
  }
  writeFileSync(join(root, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n');
  writeFileSync(join(root, 'etc/group'), 'root:x:0:\nnogroup:x:65534:\n');
  writeFileSync(join(root, 'etc/hosts'), '127.0.0.1 localhost\n::1 localhost\n');
  writeFileSync(join(root, 'etc/resolv.conf'), '');
}
