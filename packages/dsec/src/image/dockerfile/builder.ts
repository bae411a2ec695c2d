import { createHash } from 'node:crypto';
import { posix } from 'node:path';
import type { ImageConfig } from '@dsec/sdk/schema';
import type { ImageId, ImageStore } from '../image-store.js';
import type { LayerDigest } from '../layer-store.js';
import { BuildCache } from './cache.js';
import { IgnoreRules, prepareCopy } from './context.js';
import {
  DockerfileError,
  type Instruction,
  escapeOf,
  expandHeredoc,
  parseDockerfile,
  parseExecForm,
  parseKeyValues,
  splitWords,
  substitute,
  takeFlags,
} from './parser.js';
import { type BuildSandboxes, isImageNotFound } from './sandboxes.js';

/**
 * `dsec image build -f Dockerfile CONTEXT`: every RUN and COPY/ADD step runs in a real sandbox
 * created from the image so far; its changes are captured with the snapshot path (pack_diff) as
 * one layer, and the step's result is an (unnamed) image = parent layers + that layer. ENV,
 * WORKDIR, USER, CMD, ENTRYPOINT, LABEL, ARG and SHELL only change the config. Each step's
 * result is cached by parent image + instruction (+ copied files' hash, + build args), so a
 * rebuild with no change reuses every step.
 */

export interface DockerfileBuildOptions {
  images: ImageStore;
  sandboxes: BuildSandboxes;
  /** The Dockerfile's text. */
  dockerfile: string;
  contextDir: string;
  /** Tag the final image with this name. */
  name?: string;
  buildArgs?: Record<string, string>;
  /** Ignore the cache (results are still recorded). */
  noCache?: boolean;
  /** Step headers and notes, one line each ("Step 3/7 : RUN …", " ---> CACHED …"). */
  progress?: (line: string) => void;
  /** Called as each instruction starts: its index (0-based), their number, the instruction (for a progress bar). */
  onStep?: (index: number, total: number, instruction: string) => void;
  /** RUN output as it comes; default: written line by line to progress. */
  output?: (chunk: Buffer) => void;
  /** Per RUN command. @default 3600000 */
  runTimeoutMs?: number;
}

export interface DockerfileBuildResult {
  id: ImageId;
  name?: string;
  /** Instructions in the Dockerfile. */
  steps: number;
  /** RUN/COPY/ADD steps (and WORKDIR creation) reused from the cache. */
  cached: number;
  /** Such steps run in a sandbox this time. */
  executed: number;
  /** Layers this build added (steps that changed nothing add none). */
  layersAdded: number;
  config: ImageConfig;
  warnings: string[];
}

/** Paths never captured in a build step's layer (dsec's own scratch). Package caches are kept, as Docker does. */
const BUILD_SCRUB = ['/tmp/.dsec'];
const RUNNER_LABEL = 'dsec.build.runner';

const isRootUser = (user: string): boolean => /^0(:0)?$/.test(user.trim()) || user.trim() === '';
const isNumericUser = (s: string): boolean => /^\d+(:\d+)?$/.test(s);

function envMap(env: string[]): Map<string, string> {
  const m = new Map<string, string>();
  for (const kv of env) {
    const i = kv.indexOf('=');
    if (i > 0) m.set(kv.slice(0, i), kv.slice(i + 1));
  }
  return m;
}

function stateKey(layers: readonly string[], config: ImageConfig): string {
  return createHash('sha256').update(JSON.stringify({ layers, config })).digest('hex');
}

/**
 * The command of a RUN with heredocs. `RUN <<EOF` alone runs the body as a shell script, as
 * Docker does; otherwise the shell gets the command line and the bodies as written (`RUN cat
 * <<EOF > /f`, `RUN python3 <<EOF`), and handles the heredocs, quoting and `<<-` itself.
 */
function heredocRunArgv(ins: Instruction, rest: string, shell: string[]): string[] {
  const only = /^<<-?(["']?)([^\s"']+)\1$/.exec(rest.trim());
  if (only && ins.heredocs.length === 1 && only[2] === ins.heredocs[0]!.name) {
    const body = ins.heredocs[0]!.content;
    if (body.startsWith('#!'))
      throw new DockerfileError(
        `RUN <<${only[2]} with a #! line is not supported: name the interpreter on the RUN line instead (e.g. RUN python3 <<${only[2]})`,
        ins.line,
      );
    return [...shell, body];
  }
  return [...shell, ins.script!];
}

export async function buildDockerfile(opts: DockerfileBuildOptions): Promise<DockerfileBuildResult> {
  const { images, sandboxes } = opts;
  const progress = opts.progress ?? (() => {});
  const instructions = parseDockerfile(opts.dockerfile);
  if (!instructions.length) throw new DockerfileError('the Dockerfile has no instructions');
  const cache = new BuildCache(images);
  const ignore = IgnoreRules.load(opts.contextDir);
  const buildArgs = new Map(Object.entries(opts.buildArgs ?? {}));
  const usedBuildArgs = new Set<string>();
  const warnings: string[] = [];
  const warn = (m: string): void => {
    warnings.push(m);
    progress(` ---> note: ${m}`);
  };

  const globalArgs = new Map<string, string | undefined>();
  let stageArgs = new Map<string, string | undefined>();
  let state: { layers: LayerDigest[]; config: ImageConfig } | undefined;
  let shell = ['/bin/sh', '-c'];
  let cmdSetHere = false;
  let pendingWorkdir = false;
  let cached = 0;
  let executed = 0;
  let layersAdded = 0;

  const need = (ins: Instruction): { layers: LayerDigest[]; config: ImageConfig } => {
    if (!state) throw new DockerfileError(`${ins.keyword} before FROM`, ins.line);
    return state;
  };
  /** Variables for substitution: build arguments, overridden by the environment. */
  const vars = (): Map<string, string> => {
    const m = new Map<string, string>();
    for (const [k, v] of state ? stageArgs : globalArgs) if (v !== undefined) m.set(k, v);
    if (state) for (const [k, v] of envMap(state.config.env)) m.set(k, v);
    return m;
  };
  const lineWriter = (): ((b: Buffer) => void) & { flush(): void } => {
    let pending = '';
    const f = (b: Buffer): void => {
      if (opts.output) return opts.output(b);
      pending += b.toString('utf8');
      const lines = pending.split('\n');
      pending = lines.pop()!;
      for (const l of lines) progress(`  ${l}`);
    };
    return Object.assign(f, {
      flush: () => {
        if (pending) progress(`  ${pending}`);
        pending = '';
      },
    });
  };

  /** Puts an image for the current state; `asRoot` gives a variant whose processes run as root. */
  const putRunner = (asRoot: boolean): { id: ImageId; variant: boolean } => {
    const s = state!;
    const variant = asRoot && !isRootUser(s.config.user);
    const config = variant ? { ...s.config, user: '0:0', labels: { ...s.config.labels, [RUNNER_LABEL]: 'root' } } : s.config;
    return { id: images.put({ layers: s.layers, config }), variant };
  };

  /** A sandbox of the current state; the caller kills it. */
  const withSandbox = async <T>(asRoot: boolean, fn: (id: string) => Promise<T>): Promise<T> => {
    let runner = putRunner(asRoot);
    let id: string | undefined;
    for (let attempt = 0; ; attempt++) {
      try {
        id = await sandboxes.create(runner.id);
        break;
      } catch (err) {
        // Another build removed a shared runner variant between our put and create: put it again.
        if (!isImageNotFound(err) || attempt >= 3) throw err;
        runner = putRunner(asRoot);
      }
    }
    try {
      return await fn(id);
    } finally {
      await sandboxes.kill(id).catch((err: unknown) => warn(`could not kill build sandbox ${id}: ${(err as Error).message}`));
      if (runner.variant) images.remove(runner.id);
    }
  };

  /** A step that changes files: cached, or run in a sandbox and snapshotted into a layer. */
  const sandboxStep = async (key: string, ins: { original: string }, asRoot: boolean, fn: (id: string) => Promise<void>): Promise<void> => {
    const s = state!;
    const hit = opts.noCache ? undefined : cache.get(key);
    if (hit) {
      s.layers = [...images.get(hit)!.layers];
      pendingWorkdir = false;
      cached++;
      progress(` ---> CACHED ${hit.slice(0, 19)}`);
      return;
    }
    const snap = await withSandbox(asRoot, async (id) => {
      progress(` ---> running in ${id}`);
      if (pendingWorkdir) await sandboxes.mkdir(id, s.config.cwd);
      await fn(id);
      return sandboxes.snapshot(id, BUILD_SCRUB);
    });
    s.layers = snap.layers as LayerDigest[];
    const result = images.put({ layers: s.layers, config: s.config });
    if (snap.imageId !== result && images.get(snap.imageId as ImageId)?.config.labels[RUNNER_LABEL]) images.remove(snap.imageId as ImageId);
    cache.set(key, result, ins.original);
    pendingWorkdir = false;
    executed++;
    if (snap.layerAdded) layersAdded++;
    progress(` ---> ${result.slice(0, 19)}${snap.layerAdded ? '' : ' (no changes: no layer added)'}`);
  };

  /** /etc/passwd and /etc/group of the current state, read from a sandbox. */
  let etcCache: { key: string; passwd?: string; group?: string } | undefined;
  const etcFiles = async (): Promise<{ passwd?: string; group?: string }> => {
    const key = stateKey(state!.layers, { ...state!.config, user: '0:0' });
    if (etcCache?.key !== key) {
      const [passwd, group] = await withSandbox(true, async (id) =>
        Promise.all([sandboxes.readFile(id, '/etc/passwd'), sandboxes.readFile(id, '/etc/group')]),
      );
      etcCache = { key, passwd: passwd?.toString('utf8'), group: group?.toString('utf8') };
    }
    return etcCache;
  };
  const lookup = (file: string | undefined, name: string): string[] | undefined =>
    file
      ?.split('\n')
      .map((l) => l.split(':'))
      .find((f) => f[0] === name && f.length >= 3 && /^\d+$/.test(f[2] ?? ''));
  /** `user[:group]` with names → numeric `uid[:gid]` via the image's own files. */
  const resolveUser = async (spec: string, line: number): Promise<string> => {
    if (isNumericUser(spec)) return spec;
    const [u, g] = spec.split(':', 2) as [string, string | undefined];
    const etc = await etcFiles();
    let uid = u;
    let gid: string | undefined;
    if (!/^\d+$/.test(u)) {
      const f = lookup(etc.passwd, u);
      if (!f)
        throw new DockerfileError(
          `user ${JSON.stringify(u)} is not in the image's /etc/passwd${etc.passwd === undefined ? ' (the image has none)' : ''}; use a numeric uid`,
          line,
        );
      uid = f[2]!;
      gid = /^\d+$/.test(f[3] ?? '') ? f[3] : undefined;
    }
    if (g) {
      if (/^\d+$/.test(g)) gid = g;
      else {
        const f = lookup(etc.group, g);
        if (!f) throw new DockerfileError(`group ${JSON.stringify(g)} is not in the image's /etc/group; use a numeric gid`, line);
        gid = f[2];
      }
    }
    return gid === undefined ? uid : `${uid}:${gid}`;
  };

  for (const [n, ins] of instructions.entries()) {
    const esc = escapeOf(ins);
    progress(`Step ${n + 1}/${instructions.length} : ${ins.original}`);
    opts.onStep?.(n, instructions.length, ins.original);
    switch (ins.keyword) {
      case 'FROM': {
        if (state) throw new DockerfileError('multi-stage builds (a second FROM) are not supported', ins.line);
        const { flags, rest } = takeFlags(ins.args, ins.line);
        if (flags.size) warn(`FROM flags ignored: ${[...flags.keys()].map((f) => `--${f}`).join(' ')}`);
        const words = splitWords(rest, vars(), esc);
        const ref = words[0];
        if (!ref) throw new DockerfileError('FROM needs an image', ins.line);
        if (words.length > 1 && !(words.length === 3 && words[1]!.toUpperCase() === 'AS'))
          throw new DockerfileError(`FROM ${rest}: expected "FROM image [AS name]"`, ins.line);
        if (ref === 'scratch')
          throw new DockerfileError(
            'FROM scratch is not supported: build steps run in a sandbox, which needs a shell and tar (start FROM busybox)',
            ins.line,
          );
        const id = images.resolve(ref);
        const m = id && images.get(id);
        if (!m)
          throw new DockerfileError(
            `no dsec image ${JSON.stringify(ref)}: list images with \`dsec image ls\`; build or import one first`,
            ins.line,
          );
        state = { layers: [...m.layers], config: structuredClone(m.config) };
        // Builder bookkeeping of the base image is not the new image's.
        delete state.config.labels['dsec.build.key'];
        stageArgs = new Map();
        progress(` ---> ${id}`);
        break;
      }
      case 'ARG': {
        const target = state ? stageArgs : globalArgs;
        for (const word of splitWords(ins.args, undefined, esc)) {
          const eq = word.indexOf('=');
          const name = eq === -1 ? word : word.slice(0, eq);
          if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new DockerfileError(`invalid ARG name ${JSON.stringify(name)}`, ins.line);
          const dflt = eq === -1 ? undefined : substitute(word.slice(eq + 1), vars(), esc);
          let value = buildArgs.get(name) ?? dflt;
          if (value === undefined && state) value = globalArgs.get(name);
          if (buildArgs.has(name)) usedBuildArgs.add(name);
          target.set(name, value);
        }
        break;
      }
      case 'ENV': {
        const s = need(ins);
        const env = envMap(s.config.env);
        for (const [k, v] of parseKeyValues(ins.args, vars(), esc, true, ins.line)) env.set(k, v);
        s.config.env = [...env].map(([k, v]) => `${k}=${v}`);
        break;
      }
      case 'LABEL': {
        const s = need(ins);
        for (const [k, v] of parseKeyValues(ins.args, vars(), esc, false, ins.line)) s.config.labels[k] = v;
        break;
      }
      case 'MAINTAINER':
        need(ins).config.labels['maintainer'] = ins.args;
        break;
      case 'WORKDIR': {
        const s = need(ins);
        const p = substitute(ins.args, vars(), esc);
        if (!p) throw new DockerfileError('WORKDIR needs a path', ins.line);
        const abs = posix.resolve(s.config.cwd || '/', p);
        if (abs !== s.config.cwd) pendingWorkdir = true;
        s.config.cwd = abs;
        break;
      }
      case 'USER': {
        const s = need(ins);
        const spec = substitute(ins.args, vars(), esc).trim();
        if (!spec) throw new DockerfileError('USER needs a user', ins.line);
        s.config.user = await resolveUser(spec, ins.line);
        if (s.config.user !== spec) progress(` ---> user ${spec} is ${s.config.user}`);
        break;
      }
      case 'CMD':
      case 'ENTRYPOINT': {
        const s = need(ins);
        const argv = parseExecForm(ins.args) ?? (ins.args ? [...shell, ins.args] : []);
        if (ins.keyword === 'CMD') {
          s.config.cmd = argv;
          cmdSetHere = true;
        } else {
          s.config.entrypoint = argv;
          if (!cmdSetHere) s.config.cmd = []; // Docker: a new ENTRYPOINT drops the base image's CMD
        }
        break;
      }
      case 'SHELL': {
        const argv = parseExecForm(ins.args);
        if (!argv?.length) throw new DockerfileError('SHELL needs the JSON form, e.g. SHELL ["/bin/bash", "-c"]', ins.line);
        shell = argv;
        break;
      }
      case 'EXPOSE':
      case 'VOLUME':
      case 'STOPSIGNAL':
      case 'HEALTHCHECK':
      case 'ONBUILD':
        need(ins);
        warn(`${ins.keyword} is ignored (dsec images have no ports, volumes, stop signals, health checks or triggers)`);
        break;
      case 'RUN': {
        const s = need(ins);
        const { flags, rest } = takeFlags(ins.args, ins.line);
        if (flags.size) throw new DockerfileError(`RUN ${[...flags.keys()].map((f) => `--${f}`).join(' ')} is not supported`, ins.line);
        const argv = ins.heredocs.length ? heredocRunArgv(ins, rest, shell) : (parseExecForm(rest) ?? [...shell, rest]);
        // Build arguments reach RUN as environment variables; ENV wins over an ARG of the same name.
        const envKeys = envMap(s.config.env);
        const runEnv: Record<string, string> = {};
        for (const [k, v] of stageArgs) if (v !== undefined && !envKeys.has(k)) runEnv[k] = v;
        const key = BuildCache.key([stateKey(s.layers, s.config), pendingWorkdir, 'RUN', argv, runEnv]);
        await sandboxStep(key, ins, false, async (id) => {
          const out = lineWriter();
          const r = await sandboxes.run(
            id,
            { cmd: argv, cwd: s.config.cwd, env: runEnv, timeoutMs: opts.runTimeoutMs ?? 3_600_000, maxOutputBytes: 16 << 20 },
            out,
          );
          out.flush();
          if (r.timedOut) throw new DockerfileError(`${ins.original} timed out`, ins.line);
          if (r.exitCode !== 0) throw new DockerfileError(`${ins.original} returned a non-zero code: ${r.exitCode}`, ins.line);
        });
        break;
      }
      case 'COPY':
      case 'ADD': {
        const s = need(ins);
        const { flags, rest } = takeFlags(ins.args, ins.line);
        // `COPY <<EOF /path`: the body is a file; variables are substituted unless the delimiter is quoted, as in Docker.
        const inline = new Map<string, { name: string; data: Buffer }>();
        for (const h of ins.heredocs) {
          const doc = { name: h.name, data: Buffer.from(h.quoted ? h.content : expandHeredoc(h.content, vars())) };
          inline.set(`<<${h.name}`, doc).set(`<<-${h.name}`, doc);
        }
        if (flags.has('from')) throw new DockerfileError('COPY --from is not supported (single-stage builds only)', ins.line);
        for (const f of flags.keys())
          if (!['chown', 'chmod', 'link'].includes(f)) throw new DockerfileError(`${ins.keyword} --${f} is not supported`, ins.line);
        const words = parseExecForm(rest)?.map((w) => substitute(w, vars(), esc)) ?? splitWords(rest, vars(), esc);
        if (words.length < 2) throw new DockerfileError(`${ins.keyword} needs at least one source and a destination`, ins.line);
        const sources = words.slice(0, -1);
        let dest = words[words.length - 1]!;
        if (!dest.startsWith('/')) dest = posix.join(s.config.cwd, dest) + (dest.endsWith('/') || dest === '.' ? '/' : '');
        if (ins.keyword === 'ADD') {
          const archives = sources.filter((src) => /\.(tar|tgz|tar\.(gz|bz2|xz|zst))$/i.test(src));
          if (archives.length)
            warn(`ADD of local archives (${archives.join(', ')}) copies them as files; they are not unpacked (use RUN tar -x)`);
        }
        let uid = 0;
        let gid = 0;
        const chown = flags.get('chown');
        if (chown) {
          const resolved = await resolveUser(substitute(chown, vars(), esc), ins.line);
          const [u, g] = resolved.split(':');
          uid = Number(u);
          gid = g === undefined ? uid : Number(g);
        }
        const chmodFlag = flags.get('chmod');
        if (chmodFlag !== undefined && !/^[0-7]{3,4}$/.test(chmodFlag))
          throw new DockerfileError(`--chmod=${chmodFlag}: give octal permission bits`, ins.line);
        const chmod = chmodFlag === undefined ? undefined : parseInt(chmodFlag, 8);
        const copyOpts = { contextDir: opts.contextDir, sources, dest, uid, gid, chmod, ignore, line: ins.line, inline };
        const prepared = prepareCopy({ ...copyOpts, destIsExistingDir: false });
        const key = BuildCache.key([stateKey(s.layers, s.config), pendingWorkdir, ins.keyword, ins.original, prepared.hash]);
        await sandboxStep(key, ins, true, async (id) => {
          let p = prepared;
          if (!dest.endsWith('/') && (await sandboxes.stat(id, dest)) === 'dir') p = prepareCopy({ ...copyOpts, destIsExistingDir: true });
          progress(` ---> ${p.files} entr${p.files === 1 ? 'y' : 'ies'}, ${p.bytes} bytes into ${p.dir}`);
          await sandboxes.uploadTar(id, p.dir, p.tar);
        });
        break;
      }
      default:
        throw new DockerfileError(`${ins.keyword} is not supported`, ins.line);
    }
  }
  const s = state!;
  if (!s) throw new DockerfileError('the Dockerfile has no FROM');
  if (pendingWorkdir) {
    // The image's working directory must exist: a sandbox of it starts commands there.
    progress(`Creating WORKDIR ${s.config.cwd}`);
    await sandboxStep(
      BuildCache.key([stateKey(s.layers, s.config), 'WORKDIR-create', s.config.cwd]),
      { original: `WORKDIR ${s.config.cwd} (create)` },
      true,
      async () => {},
    );
  }
  for (const a of buildArgs.keys()) if (!usedBuildArgs.has(a)) warn(`build argument ${a} was not consumed by any ARG`);
  const id = images.put({ layers: s.layers, config: s.config });
  if (opts.name) images.tag(opts.name, id);
  progress(
    `Successfully built ${id.slice(0, 19)}${opts.name ? ` and tagged ${opts.name}` : ''} (${cached} cached, ${executed} run, ${layersAdded} layers added)`,
  );
  return {
    id,
    ...(opts.name ? { name: opts.name } : {}),
    steps: instructions.length,
    cached,
    executed,
    layersAdded,
    config: s.config,
    warnings,
  };
}
