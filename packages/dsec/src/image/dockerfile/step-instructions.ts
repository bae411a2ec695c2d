import { posix } from 'node:path';
import { BuildCache } from './cache.js';
import { type DockerfileBuild, type InstructionHandler, envMap, stateKey } from './build-state.js';
import { archiveFromStage } from './copy-from.js';
import { prepareCopy } from './context.js';
import { resolveUser } from './image-users.js';
import { DockerfileError, type Instruction, expandHeredoc, parseExecForm, splitWords, substitute, takeFlags } from './parser.js';
import { sandboxStep } from './sandbox-steps.js';

// The instructions that change the image's files, each a step run in a sandbox (or found in the
// cache): RUN, COPY and ADD.

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

const run: InstructionHandler = async (b, ins) => {
  const s = b.need(ins);
  const { flags, rest } = takeFlags(ins.args, ins.line);
  if (flags.size) throw new DockerfileError(`RUN ${[...flags.keys()].map((f) => `--${f}`).join(' ')} is not supported`, ins.line);
  const argv = ins.heredocs.length ? heredocRunArgv(ins, rest, b.shell) : (parseExecForm(rest) ?? [...b.shell, rest]);
  // Build arguments reach RUN as environment variables; ENV wins over an ARG of the same name.
  const envKeys = envMap(s.config.env);
  const runEnv: Record<string, string> = {};
  for (const [k, v] of b.stageArgs) if (v !== undefined && !envKeys.has(k)) runEnv[k] = v;
  const key = BuildCache.key([stateKey(s.layers, s.config), b.pendingWorkdir, 'RUN', argv, runEnv]);
  await sandboxStep(b, key, ins, false, async (id) => {
    const out = b.lineWriter();
    const r = await b.sandboxes.run(
      id,
      { cmd: argv, cwd: s.config.cwd, env: runEnv, timeoutMs: b.opts.runTimeoutMs ?? 3_600_000, maxOutputBytes: 16 << 20 },
      out,
    );
    out.flush();
    if (r.timedOut) throw new DockerfileError(`${ins.original} timed out`, ins.line);
    if (r.exitCode !== 0) throw new DockerfileError(`${ins.original} returned a non-zero code: ${r.exitCode}`, ins.line);
  });
};

const copyOrAdd: InstructionHandler = async (b, ins, esc) => {
  const s = b.need(ins);
  const { flags, rest } = takeFlags(ins.args, ins.line);
  // `COPY <<EOF /path`: the body is a file; variables are substituted unless the delimiter is quoted, as in Docker.
  const inline = new Map<string, { name: string; data: Buffer }>();
  for (const h of ins.heredocs) {
    const doc = { name: h.name, data: Buffer.from(h.quoted ? h.content : expandHeredoc(h.content, b.vars())) };
    inline.set(`<<${h.name}`, doc).set(`<<-${h.name}`, doc);
  }
  if (flags.has('from') && ins.keyword === 'ADD')
    throw new DockerfileError('ADD --from is not a Dockerfile flag: use COPY --from', ins.line);
  for (const f of flags.keys())
    if (!['chown', 'chmod', 'link', 'from'].includes(f)) throw new DockerfileError(`${ins.keyword} --${f} is not supported`, ins.line);
  const words = parseExecForm(rest)?.map((w) => substitute(w, b.vars(), esc)) ?? splitWords(rest, b.vars(), esc);
  if (words.length < 2) throw new DockerfileError(`${ins.keyword} needs at least one source and a destination`, ins.line);
  const sources = words.slice(0, -1);
  let dest = words[words.length - 1]!;
  if (!dest.startsWith('/')) dest = posix.join(s.config.cwd, dest) + (dest.endsWith('/') || dest === '.' ? '/' : '');
  if (ins.keyword === 'ADD') {
    const archives = sources.filter((src) => /\.(tar|tgz|tar\.(gz|bz2|xz|zst))$/i.test(src));
    if (archives.length)
      b.warn(`ADD of local archives (${archives.join(', ')}) copies them as files; they are not unpacked (use RUN tar -x)`);
  }
  let uid = 0;
  let gid = 0;
  const chown = flags.get('chown');
  if (chown) {
    const resolved = await resolveUser(b, substitute(chown, b.vars(), esc), ins.line);
    const [u, g] = resolved.split(':');
    uid = Number(u);
    gid = g === undefined ? uid : Number(g);
  }
  const chmodFlag = flags.get('chmod');
  if (chmodFlag !== undefined && !/^[0-7]{3,4}$/.test(chmodFlag))
    throw new DockerfileError(`--chmod=${chmodFlag}: give octal permission bits`, ins.line);
  const chmod = chmodFlag === undefined ? undefined : parseInt(chmodFlag, 8);
  const fromFlag = flags.get('from');
  if (fromFlag !== undefined) return copyFromStage(b, ins, substitute(fromFlag, b.vars(), esc), sources, dest, { uid, gid, chmod });
  const copyOpts = { contextDir: b.opts.contextDir, sources, dest, uid, gid, chmod, ignore: b.ignore, line: ins.line, inline };
  const prepared = prepareCopy({ ...copyOpts, destIsExistingDir: false });
  const key = BuildCache.key([stateKey(s.layers, s.config), b.pendingWorkdir, ins.keyword, ins.original, prepared.hash]);
  await sandboxStep(b, key, ins, true, async (id) => {
    let p = prepared;
    if (!dest.endsWith('/') && (await b.sandboxes.stat(id, dest)) === 'dir') p = prepareCopy({ ...copyOpts, destIsExistingDir: true });
    b.progress(` ---> ${p.files} entr${p.files === 1 ? 'y' : 'ies'}, ${p.bytes} bytes into ${p.dir}`);
    await b.sandboxes.uploadTar(id, p.dir, p.tar);
  });
};

/** COPY --from=STAGE|IMAGE: files of an earlier stage (or an image) instead of the context (copy-from.ts). */
async function copyFromStage(
  b: DockerfileBuild,
  ins: Instruction,
  ref: string,
  sources: string[],
  dest: string,
  owner: { uid: number; gid: number; chmod: number | undefined },
): Promise<void> {
  const s = b.need(ins);
  if (ref.toLowerCase() === b.stageName)
    throw new DockerfileError(`COPY --from=${ref}: that is the stage being built; name an earlier stage or an image`, ins.line);
  let source = b.finishedStage(ref);
  if (!source) {
    const id = b.images.resolve(ref);
    const m = id && b.images.get(id);
    if (!m) throw new DockerfileError(`COPY --from=${ref}: no earlier stage or dsec image of that name`, ins.line);
    source = { layers: [...m.layers], config: m.config };
  }
  const from = source;
  const key = BuildCache.key([
    stateKey(s.layers, s.config),
    b.pendingWorkdir,
    'COPY --from',
    stateKey(from.layers, from.config),
    sources,
    dest,
    owner,
  ]);
  await sandboxStep(b, key, ins, true, async (id) => {
    const destIsDir = !dest.endsWith('/') && (await b.sandboxes.stat(id, dest)) === 'dir';
    const a = await archiveFromStage(b, from, sources, dest, destIsDir, owner, ins.line);
    b.progress(` ---> ${a.entries} entr${a.entries === 1 ? 'y' : 'ies'}, ${a.bytes} bytes from ${ref} into ${a.dir}`);
    await b.sandboxes.mkdir(id, a.dir);
    await b.sandboxes.uploadTar(id, a.dir, a.tar);
  });
}

export const STEP_INSTRUCTIONS: Record<string, InstructionHandler> = { RUN: run, COPY: copyOrAdd, ADD: copyOrAdd };
