import { posix } from 'node:path';
import { type DockerfileBuild, type InstructionHandler, type StageImage, envMap } from './build-state.js';
import { createPendingWorkdir } from './sandbox-steps.js';
import { parseRegistryRef } from '../registry/registry-ref.js';
import { resolveUser } from './image-users.js';
import { DockerfileError, parseExecForm, parseKeyValues, splitWords, substitute, takeFlags } from './parser.js';

// The instructions that change the image's config (and the build's variables), not its files:
// FROM, ARG, ENV, LABEL, MAINTAINER, WORKDIR, USER, CMD, ENTRYPOINT, SHELL, and those dsec ignores.

/**
 * FROM starts a stage: from a dsec image, or from an earlier stage of this Dockerfile (`FROM
 * build`); a stage named with `AS` can be copied from (`COPY --from=build`). The stage before it
 * is finished first (its pending WORKDIR made), and the last stage is the image built.
 */
const from: InstructionHandler = async (b, ins, esc) => {
  const { flags, rest } = takeFlags(ins.args, ins.line);
  if (flags.size) b.warn(`FROM flags ignored: ${[...flags.keys()].map((f) => `--${f}`).join(' ')}`);
  // FROM lines see the build arguments declared before the first FROM, whatever stage precedes.
  const words = splitWords(rest, globalVars(b), esc);
  const ref = words[0];
  if (!ref) throw new DockerfileError('FROM needs an image', ins.line);
  if (words.length > 1 && !(words.length === 3 && words[1]!.toUpperCase() === 'AS'))
    throw new DockerfileError(`FROM ${rest}: expected "FROM image [AS name]"`, ins.line);
  const name = words[2]?.toLowerCase();
  if (name !== undefined && !/^[a-z][a-z0-9._-]*$/.test(name))
    throw new DockerfileError(
      `FROM … AS ${words[2]}: a stage name starts with a letter and has letters, digits, '.', '_' or '-'`,
      ins.line,
    );
  if (name !== undefined && (b.finishedStage(name) || name === b.stageName))
    throw new DockerfileError(`FROM … AS ${name}: a stage of that name is already defined`, ins.line);
  if (ref === 'scratch')
    throw new DockerfileError(
      'FROM scratch is not supported: build steps run in a sandbox, which needs a shell and tar (start FROM busybox)',
      ins.line,
    );
  if (b.stage) {
    if (b.pendingWorkdir) await createPendingWorkdir(b);
    b.stages.push({ name: b.stageName, image: b.stage });
  }
  // FROM names a stage by its name only (an index is COPY --from's alone).
  const earlier = /^\d+$/.test(ref) ? undefined : b.finishedStage(ref);
  let base: StageImage;
  if (earlier) {
    base = earlier;
    b.progress(` ---> stage ${ref}`);
  } else {
    let id = b.images.resolve(ref);
    if (!id && isRegistryRef(ref)) {
      if (!b.opts.pull) throw new DockerfileError(`FROM ${ref}: pull it first (dsec image pull ${ref})`, ins.line);
      b.progress(` ---> pulling ${ref}`);
      id = b.images.resolve(await b.opts.pull(ref, (l) => b.progress(`  ${l}`)));
    }
    const m = id && b.images.get(id);
    if (!m)
      throw new DockerfileError(
        `no dsec image or earlier stage ${JSON.stringify(ref)}: list images with \`dsec image ls\`; build, import or pull one first (a registry reference has a host: HOST[:PORT]/REPO[:TAG])`,
        ins.line,
      );
    base = m;
    b.progress(` ---> ${id}`);
  }
  b.stage = { layers: [...base.layers], config: structuredClone(base.config) };
  // Builder bookkeeping of the base image is not the new image's.
  delete b.stage.config.labels['dsec.build.key'];
  b.stageName = name;
  b.stageArgs = new Map();
  // SHELL, a CMD set here and a pending WORKDIR belong to the stage they were given in.
  b.shell = ['/bin/sh', '-c'];
  b.cmdSetHere = false;
  b.pendingWorkdir = false;
  b.etcCache = undefined;
};

/** Whether FROM names an image in a registry (a host part: a dot, a port or localhost) rather than a dsec image name. */
function isRegistryRef(ref: string): boolean {
  if (!ref.includes('/')) return false;
  try {
    parseRegistryRef(ref);
    return true;
  } catch {
    return false;
  }
}

/** The arguments FROM lines substitute: those declared before the first FROM (with --build-arg values). */
function globalVars(b: DockerfileBuild): Map<string, string> {
  const m = new Map<string, string>();
  for (const [k, v] of b.globalArgs) if (v !== undefined) m.set(k, v);
  return m;
}

const arg: InstructionHandler = (b, ins, esc) => {
  const target = b.stage ? b.stageArgs : b.globalArgs;
  for (const word of splitWords(ins.args, undefined, esc)) {
    const eq = word.indexOf('=');
    const name = eq === -1 ? word : word.slice(0, eq);
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new DockerfileError(`invalid ARG name ${JSON.stringify(name)}`, ins.line);
    const dflt = eq === -1 ? undefined : substitute(word.slice(eq + 1), b.vars(), esc);
    let value = b.buildArgs.get(name) ?? dflt;
    if (value === undefined && b.stage) value = b.globalArgs.get(name);
    if (b.buildArgs.has(name)) b.usedBuildArgs.add(name);
    target.set(name, value);
  }
};

const env: InstructionHandler = (b, ins, esc) => {
  const s = b.need(ins);
  const vars = envMap(s.config.env);
  for (const [k, v] of parseKeyValues(ins.args, b.vars(), esc, true, ins.line)) vars.set(k, v);
  s.config.env = [...vars].map(([k, v]) => `${k}=${v}`);
};

const label: InstructionHandler = (b, ins, esc) => {
  const s = b.need(ins);
  for (const [k, v] of parseKeyValues(ins.args, b.vars(), esc, false, ins.line)) s.config.labels[k] = v;
};

const maintainer: InstructionHandler = (b, ins) => {
  b.need(ins).config.labels['maintainer'] = ins.args;
};

const workdir: InstructionHandler = (b, ins, esc) => {
  const s = b.need(ins);
  const p = substitute(ins.args, b.vars(), esc);
  if (!p) throw new DockerfileError('WORKDIR needs a path', ins.line);
  const abs = posix.resolve(s.config.cwd || '/', p);
  if (abs !== s.config.cwd) b.pendingWorkdir = true;
  s.config.cwd = abs;
};

const user: InstructionHandler = async (b, ins, esc) => {
  const s = b.need(ins);
  const spec = substitute(ins.args, b.vars(), esc).trim();
  if (!spec) throw new DockerfileError('USER needs a user', ins.line);
  s.config.user = await resolveUser(b, spec, ins.line);
  if (s.config.user !== spec) b.progress(` ---> user ${spec} is ${s.config.user}`);
};

const cmdOrEntrypoint: InstructionHandler = (b, ins) => {
  const s = b.need(ins);
  const argv = parseExecForm(ins.args) ?? (ins.args ? [...b.shell, ins.args] : []);
  if (ins.keyword === 'CMD') {
    s.config.cmd = argv;
    b.cmdSetHere = true;
  } else {
    s.config.entrypoint = argv;
    if (!b.cmdSetHere) s.config.cmd = []; // Docker: a new ENTRYPOINT drops the base image's CMD
  }
};

const shell: InstructionHandler = (b, ins) => {
  const argv = parseExecForm(ins.args);
  if (!argv?.length) throw new DockerfileError('SHELL needs the JSON form, e.g. SHELL ["/bin/bash", "-c"]', ins.line);
  b.shell = argv;
};

const ignored: InstructionHandler = (b, ins) => {
  b.need(ins);
  b.warn(`${ins.keyword} is ignored (dsec images have no ports, volumes, stop signals, health checks or triggers)`);
};

export const CONFIG_INSTRUCTIONS: Record<string, InstructionHandler> = {
  FROM: from,
  ARG: arg,
  ENV: env,
  LABEL: label,
  MAINTAINER: maintainer,
  WORKDIR: workdir,
  USER: user,
  CMD: cmdOrEntrypoint,
  ENTRYPOINT: cmdOrEntrypoint,
  SHELL: shell,
  EXPOSE: ignored,
  VOLUME: ignored,
  STOPSIGNAL: ignored,
  HEALTHCHECK: ignored,
  ONBUILD: ignored,
};
