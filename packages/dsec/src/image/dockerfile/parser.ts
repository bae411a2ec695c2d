/**
 * Dockerfile parsing: parser directives (`# escape=`), comments, line continuations, and the
 * instructions dsec builds (FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, ENTRYPOINT, CMD,
 * LABEL, SHELL, plus EXPOSE/VOLUME/STOPSIGNAL/HEALTHCHECK/MAINTAINER, which are noted and
 * ignored). Variable substitution follows Docker's rules: $VAR, ${VAR}, ${VAR:-word},
 * ${VAR:+word}, no expansion inside single quotes, and never in RUN/CMD/ENTRYPOINT (the shell's job).
 */

export class DockerfileError extends Error {
  override readonly name = 'DockerfileError';
  constructor(
    message: string,
    readonly line?: number,
  ) {
    super(line === undefined ? message : `Dockerfile line ${line}: ${message}`);
  }
}

export interface Instruction {
  /** Upper-case keyword. */
  keyword: string;
  /** Everything after the keyword, continuations joined, leading/trailing space trimmed. */
  args: string;
  /** The instruction as written, on one line (for progress and cache keys). */
  original: string;
  line: number;
}

const KNOWN = new Set([
  'FROM',
  'RUN',
  'COPY',
  'ADD',
  'ENV',
  'ARG',
  'WORKDIR',
  'USER',
  'ENTRYPOINT',
  'CMD',
  'LABEL',
  'SHELL',
  'EXPOSE',
  'VOLUME',
  'STOPSIGNAL',
  'HEALTHCHECK',
  'MAINTAINER',
  'ONBUILD',
]);

/** Splits a Dockerfile into instructions. */
export function parseDockerfile(text: string): Instruction[] {
  const lines = text.replace(/\r\n?/g, '\n').split('\n');
  let escape = '\\';
  // Parser directives: only at the very top, `# key=value`, before any other line.
  let i = 0;
  for (; i < lines.length; i++) {
    const m = /^#\s*([a-zA-Z][a-zA-Z0-9_-]*)\s*=\s*(.*?)\s*$/.exec(lines[i]!);
    if (!m) break;
    if (m[1]!.toLowerCase() === 'escape') {
      if (m[2] !== '\\' && m[2] !== '`') throw new DockerfileError(`invalid escape directive ${JSON.stringify(m[2])}: use \\ or \``, i + 1);
      escape = m[2];
    }
  }
  const out: Instruction[] = [];
  let buf = '';
  let start = 0;
  for (let n = 0; n < lines.length; n++) {
    const raw = lines[n]!;
    const trimmed = raw.trim();
    if (buf === '') {
      if (trimmed === '' || trimmed.startsWith('#')) continue;
      start = n + 1;
    } else if (trimmed.startsWith('#') || trimmed === '') {
      continue; // comments and empty lines inside a continuation are dropped
    }
    const body = raw.replace(/\s+$/, '');
    if (body.endsWith(escape) && !body.endsWith(escape + escape)) {
      buf += body.slice(0, -1);
      if (n === lines.length - 1) out.push(toInstruction(buf, start));
      continue;
    }
    buf += body;
    out.push(toInstruction(buf, start));
    buf = '';
  }
  return out.map((ins) => ({ ...ins, escape }) as Instruction);

  function toInstruction(line: string, lineNo: number): Instruction {
    const m = /^\s*(\S+)\s*([\s\S]*)$/.exec(line)!;
    const keyword = m[1]!.toUpperCase();
    if (!KNOWN.has(keyword)) throw new DockerfileError(`unknown instruction ${m[1]}`, lineNo);
    const args = m[2]!.trim();
    return { keyword, args, original: `${keyword} ${args}`.trim(), line: lineNo };
  }
}

/** The escape character an instruction was parsed with. */
export function escapeOf(ins: Instruction): string {
  return (ins as Instruction & { escape?: string }).escape ?? '\\';
}

/** `["a", "b"]` → ['a','b']; undefined when the text is not a JSON array of strings (shell form). */
export function parseExecForm(args: string): string[] | undefined {
  if (!args.startsWith('[')) return undefined;
  try {
    const v: unknown = JSON.parse(args);
    if (Array.isArray(v) && v.every((x) => typeof x === 'string')) return v as string[];
  } catch {
    // not JSON: Docker treats it as shell form
  }
  return undefined;
}

/** Leading `--name=value` flags of COPY/ADD/RUN/FROM. */
export function takeFlags(args: string, line: number): { flags: Map<string, string>; rest: string } {
  const flags = new Map<string, string>();
  let rest = args;
  for (;;) {
    const m = /^--([a-zA-Z][a-zA-Z0-9-]*)(?:=(\S*))?\s*/.exec(rest);
    if (!m) break;
    if (flags.has(m[1]!)) throw new DockerfileError(`flag --${m[1]} given twice`, line);
    flags.set(m[1]!, m[2] ?? 'true');
    rest = rest.slice(m[0].length);
  }
  return { flags, rest };
}

/**
 * Splits words (whitespace-separated, with quotes and escapes) and substitutes variables. Single
 * quotes keep text literal; double quotes group words and still expand; the escape character
 * escapes the next character (and `$`).
 */
export function splitWords(text: string, vars: ReadonlyMap<string, string> | undefined, escape = '\\', split = true): string[] {
  const words: string[] = [];
  let cur = '';
  let inWord = false;
  let i = 0;
  const expandAt = (): string => {
    // text[i] === '$'
    const rest = text.slice(i + 1);
    let m = /^\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\}/.exec(rest);
    if (m) {
      i += 1 + m[0].length;
      const v = vars?.get(m[1]!);
      if (m[2] === '-') return v !== undefined && v !== '' ? v : substitute(m[3]!, vars, escape);
      if (m[2] === '+') return v !== undefined && v !== '' ? substitute(m[3]!, vars, escape) : '';
      return v ?? '';
    }
    m = /^([A-Za-z_][A-Za-z0-9_]*)/.exec(rest);
    if (m) {
      i += 1 + m[0].length;
      return vars?.get(m[1]!) ?? '';
    }
    i += 1;
    return '$';
  };
  while (i < text.length) {
    const c = text[i]!;
    if (c === escape && i + 1 < text.length) {
      cur += text[i + 1];
      inWord = true;
      i += 2;
    } else if (c === "'") {
      const end = text.indexOf("'", i + 1);
      if (end === -1) throw new DockerfileError(`unterminated single quote in ${JSON.stringify(text)}`);
      cur += text.slice(i + 1, end);
      inWord = true;
      i = end + 1;
    } else if (c === '"') {
      i++;
      inWord = true;
      while (i < text.length && text[i] !== '"') {
        if (text[i] === escape && i + 1 < text.length && (text[i + 1] === '"' || text[i + 1] === escape || text[i + 1] === '$')) {
          cur += text[i + 1];
          i += 2;
        } else if (text[i] === '$' && vars) cur += expandAt();
        else cur += text[i++];
      }
      if (i >= text.length) throw new DockerfileError(`unterminated double quote in ${JSON.stringify(text)}`);
      i++;
    } else if (split && /\s/.test(c)) {
      if (inWord) words.push(cur);
      cur = '';
      inWord = false;
      i++;
    } else if (c === '$' && vars) {
      cur += expandAt();
      inWord = true;
    } else {
      cur += c;
      inWord = true;
      i++;
    }
  }
  if (inWord) words.push(cur);
  return words;
}

/** Substitutes variables in text as one word (quotes removed), e.g. a WORKDIR path. */
export function substitute(text: string, vars: ReadonlyMap<string, string> | undefined, escape = '\\'): string {
  return splitWords(text, vars, escape, false)[0] ?? '';
}

/** `K=V K2="v 2"` (or the legacy `K V…` form when allowed) → pairs, values substituted. */
export function parseKeyValues(
  args: string,
  vars: ReadonlyMap<string, string>,
  escape: string,
  legacy: boolean,
  line: number,
): [string, string][] {
  const first = /^(\S+)/.exec(args)?.[1] ?? '';
  if (legacy && !first.includes('=')) {
    const m = /^(\S+)\s+([\s\S]*)$/.exec(args);
    if (!m) throw new DockerfileError(`${JSON.stringify(args)} needs a value`, line);
    return [[m[1]!, splitWords(m[2]!, vars, escape).join(' ')]];
  }
  return splitWords(args, vars, escape).map((w) => {
    const eq = w.indexOf('=');
    if (eq <= 0) throw new DockerfileError(`${JSON.stringify(w)} is not KEY=VALUE`, line);
    return [w.slice(0, eq), w.slice(eq + 1)];
  });
}
