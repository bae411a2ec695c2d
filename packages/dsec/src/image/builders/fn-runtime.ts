import { createHash } from 'node:crypto';
import {
  copyFileSync,
  cpSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmSync,
  statSync,
  symlinkSync,
} from 'node:fs';
import { dirname, join } from 'node:path';
import { runToolOrThrow } from '../../host/run-tool.js';
import { defaultImageConfig, type ImageStore } from '../image-store.js';
import { BUSYBOX_PATH, layOutBusybox } from './busybox.js';
import { buildSingleLayerImage, uuidFromKey, type BuiltImage, type Progress } from './builder.js';

const BUILDER_VERSION = 'fn-runtime-1';
/** Debian's interpreters (scripts/setup installs python3; Node is the one dsec itself runs on). */
const PYTHON = '/usr/bin/python3';
const BASH = '/bin/bash';
const NODE = '/usr/bin/node';

/**
 * The default image of function calls (`fn-runtime`): busybox, plus this host's python3 with its
 * standard library, bash and node, each with the shared libraries it loads; no package manager,
 * no network, seconds to build. python3 is required (each worker's fork server is python); bash
 * and node are taken when the host has them. Cached by the binaries' sizes and times.
 */
export async function buildFnRuntimeImage(store: ImageStore, opts: { name?: string; progress?: Progress } = {}): Promise<BuiltImage> {
  const progress = opts.progress ?? (() => {});
  if (!existsSync(PYTHON)) throw new Error(`the fn-runtime image needs ${PYTHON} on this host (apt-get install python3)`);
  const python = realpathSync(PYTHON);
  const stdlib = `/usr/lib/${python.split('/').pop()!}`;
  const programs = [python, realpathSync(BASH), existsSync(NODE) ? realpathSync(NODE) : undefined].filter(
    (p): p is string => p !== undefined && existsSync(p),
  );
  const key = createHash('sha256').update(BUILDER_VERSION).update(readFileSync(BUSYBOX_PATH));
  for (const p of [...programs, stdlib]) key.update(`${p}:${statSync(p).size}:${statSync(p).mtimeMs}`);
  const cacheKey = key.digest('hex');
  return buildSingleLayerImage({
    store,
    name: opts.name ?? 'fn-runtime',
    cacheKey,
    progress,
    erofs: { compression: 'none', reproducible: { timestamp: 0, uuid: uuidFromKey(cacheKey) } },
    config: defaultImageConfig({
      cmd: ['/bin/sh'],
      env: ['PATH=/usr/local/bin:/usr/bin:/bin', 'LANG=C.UTF-8'],
      labels: { 'dsec.builder': 'fn-runtime' },
    }),
    fill: async (root) => {
      progress('laying out busybox');
      await layOutBusybox(root);
      const libs = new Set<string>();
      for (const p of programs) {
        progress(`copying ${p}`);
        copyInto(root, p);
        for (const l of await sharedLibraries(p)) libs.add(l);
      }
      progress(`copying the python standard library (${stdlib})`);
      cpSync(stdlib, join(root, stdlib), {
        recursive: true,
        verbatimSymlinks: true,
        filter: (src) => !src.includes('/site-packages') && !src.includes('/dist-packages'),
      });
      const dynload = join(stdlib, 'lib-dynload');
      for (const so of existsSync(dynload) ? readdirSync(dynload) : [])
        for (const l of await sharedLibraries(join(dynload, so))) libs.add(l);
      for (const l of libs) copyInto(root, l);
      // The names programs are called by; busybox's applets of the same name give way.
      link(root, python, '/usr/bin/python3');
      link(root, realpathSync(BASH), '/bin/bash');
      link(root, realpathSync(BASH), '/usr/bin/bash');
      if (programs.some((p) => p === realpathSync(NODE))) link(root, realpathSync(NODE), '/usr/bin/node');
    },
  });
}

/** Copies a host file to the same path under root (a symlinked path is copied as the file it names). */
function copyInto(root: string, path: string): void {
  const dest = join(root, path);
  mkdirSync(dirname(dest), { recursive: true });
  if (!existsSync(dest)) copyFileSync(realpathSync(path), dest);
}

/** Links `name` to `target` under root; a busybox applet link of the same name gives way. */
function link(root: string, target: string, name: string): void {
  const dest = join(root, name);
  mkdirSync(dirname(dest), { recursive: true });
  if (dest === join(root, target)) return;
  rmSync(dest, { force: true });
  symlinkSync(target, dest);
}

/** The shared libraries a program or module loads (and the dynamic loader), by ldd. */
async function sharedLibraries(path: string): Promise<string[]> {
  let out: string;
  try {
    out = (await runToolOrThrow('ldd', [path])).stdout;
  } catch {
    return []; // static, or not an ELF file
  }
  const libs: string[] = [];
  for (const line of out.split('\n')) {
    const m = /=>\s*(\/\S+)/.exec(line) ?? /^\s*(\/\S+)\s*\(/.exec(line);
    if (m) libs.push(m[1]!);
  }
  return libs;
}
