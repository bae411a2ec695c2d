import { createHash } from 'node:crypto';
import { readFileSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { runToolOrThrow } from '../../host/run-tool.js';
import { defaultImageConfig, type ImageStore } from '../image-store.js';
import { buildSingleLayerImage, type BuiltImage, type Progress } from './builder.js';

const BUILDER_VERSION = 'debian-1';
const SUITE = 'bookworm';

/** The Debian mirror this host's apt already uses, so builds reach the same registry. */
export function hostDebianMirror(): string {
  const candidates: string[] = [];
  try {
    for (const f of readdirSync('/etc/apt/sources.list.d')) {
      if (!f.endsWith('.sources')) continue;
      for (const m of readFileSync(join('/etc/apt/sources.list.d', f), 'utf8').matchAll(/^URIs:\s*(\S+)/gm)) candidates.push(m[1]!);
    }
  } catch {
    // no sources.list.d
  }
  try {
    for (const m of readFileSync('/etc/apt/sources.list', 'utf8').matchAll(/^deb\s+(?:\[[^\]]*\]\s+)?(\S+)/gm)) candidates.push(m[1]!);
  } catch {
    // no sources.list
  }
  return candidates.find((u) => /\/debian\/?$/.test(u)) ?? 'http://deb.debian.org/debian';
}

/** Builds a Debian minbase image with debootstrap, optionally with extra packages (python3, git…). */
export async function buildDebianImage(
  store: ImageStore,
  opts: {
    name?: string;
    packages?: string[];
    progress?: Progress;
    /** A last step on the finished tree (add users, config); its `key` joins the cache key. */
    customize?: { key: string; run: (root: string) => Promise<void> };
  } = {},
): Promise<BuiltImage> {
  const progress = opts.progress ?? (() => {});
  const packages = [...new Set(opts.packages ?? [])].sort();
  const mirror = hostDebianMirror();
  const keyParts: unknown[] = [BUILDER_VERSION, SUITE, packages];
  if (opts.customize) keyParts.push(opts.customize.key);
  const cacheKey = createHash('sha256').update(JSON.stringify(keyParts)).digest('hex');
  return buildSingleLayerImage({
    store,
    name: opts.name ?? (packages.length ? `debian:${createHash('sha256').update(packages.join(',')).digest('hex').slice(0, 8)}` : 'debian'),
    cacheKey,
    progress,
    erofs: { compression: 'lz4' },
    config: defaultImageConfig({ cmd: ['/bin/bash'], labels: { 'dsec.builder': 'debian', 'dsec.debian.packages': packages.join(',') } }),
    fill: async (root) => {
      progress(
        `debootstrap --variant=minbase ${SUITE} from ${mirror}${packages.length ? ` with ${packages.join(', ')}` : ''} (about a minute)`,
      );
      const args = ['--variant=minbase'];
      if (packages.length) args.push(`--include=${packages.join(',')}`);
      args.push(SUITE, root, mirror);
      let last = 0;
      await runToolOrThrow('debootstrap', args, {
        onStdout: (chunk) => {
          const now = Date.now();
          const line = chunk.trim().split('\n').pop();
          if (line && now - last > 5000) {
            last = now;
            progress(`  ${line}`);
          }
        },
      });
      // apt's caches and lists are a third of the tree and useless inside a sandbox.
      for (const d of ['var/cache/apt/archives', 'var/lib/apt/lists']) {
        for (const f of readdirSync(join(root, d)))
          if (f !== 'partial' && f !== 'lock') rmSync(join(root, d, f), { recursive: true, force: true });
      }
      if (opts.customize) await opts.customize.run(root);
    },
  });
}
