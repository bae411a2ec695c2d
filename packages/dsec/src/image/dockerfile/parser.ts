import { Copy, DockerfileParser, Run } from 'dockerfile-ast';

/**
 * Dockerfile parsing. The structure comes from dockerfile-ast (the parser of the Docker language
 * server in VS Code and other editors): parser directives (`# escape=`), comments, where each
 * instruction starts and ends across line continuations, heredocs (`RUN <<EOF`) and their
 * delimiters. This module joins an instruction's lines into its arguments itself, because
 * dockerfile-ast's own argument text keeps comment lines that sit inside a continuation, which
 * Docker drops. It also checks what dockerfile-ast lets pass: an escape directive other than
 * \ or `, and a heredoc whose delimiter line never comes (dockerfile-ast then ends the
 * instruction at the end of the file, or continues a body line ending in the escape character
 * into the delimiter line).
 *
 * Variable substitution follows Docker's rules: $VAR, ${VAR}, ${VAR:-word}, ${VAR:+word}, no
 * expansion inside single quotes, and never in RUN/CMD/ENTRYPOINT (the shell's job). It works on
 * the build's state (ARG and ENV so far), which a parser of the text cannot know.
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

export interface Heredoc {
  /** The delimiter word, without quotes. */
  name: string;
  /** The lines between the `<<NAME` line and the delimiter, each with its newline. */
  content: string;
  /** `<<-NAME`: leading tabs of the content and of the delimiter are stripped. */
  stripTabs: boolean;
  /** `<<"NAME"` or `<<'NAME'`: the content is taken as it is, without variable substitution. */
  quoted: boolean;
}

export interface Instruction {
  /** Upper-case keyword. */
  keyword: string;
  /** Everything after the keyword on its (joined) line, leading/trailing space trimmed; heredoc bodies not included. */
  args: string;
  /** The instruction as written, on one line (for progress and cache keys). */
  original: string;
  line: number;
  /** The escape character of the Dockerfile (`# escape=`). */
  escape: string;
  /** Heredocs of RUN and COPY, in the order their `<<` markers appear. */
  heredocs: Heredoc[];
  /** For an instruction with heredocs: its arguments and every line after them up to the last delimiter, as a shell reads them. */
  script?: string;
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

/** Whether a line ends in the escape character (not an escaped one): the next line continues it. */
function continues(line: string, escape: string): boolean {
  const body = line.replace(/\s+$/, '');
  return body.endsWith(escape) && !body.endsWith(escape + escape);
}

/** Joins an instruction's continuation lines; comment and empty lines inside are dropped. */
function joinLines(lines: string[], escape: string): string {
  let out = '';
  for (const [n, raw] of lines.entries()) {
    const trimmed = raw.trim();
    if (n > 0 && (trimmed === '' || trimmed.startsWith('#'))) continue;
    const body = raw.replace(/\s+$/, '');
    out += continues(body, escape) ? body.slice(0, -1) : body;
  }
  return out;
}

/** Splits a Dockerfile into instructions. */
export function parseDockerfile(text: string): Instruction[] {
  const normalized = text.replace(/\r\n?/g, '\n');
  const lines = normalized.split('\n');
  const df = DockerfileParser.parse(normalized);
  for (const d of df.getDirectives()) {
    if (d.getName()?.toLowerCase() !== 'escape') continue;
    const v = d.getValue();
    if (v !== '\\' && v !== '`')
      throw new DockerfileError(`invalid escape directive ${JSON.stringify(v)}: use \\ or \``, d.getRange().start.line + 1);
  }
  const escape = df.getEscapeCharacter();
  return df.getInstructions().map((ins) => {
    const start = ins.getRange().start.line;
    const end = ins.getRange().end.line;
    const lineNo = start + 1;
    const keyword = ins.getKeyword();
    if (!KNOWN.has(keyword)) throw new DockerfileError(`unknown instruction ${ins.getInstruction()}`, lineNo);
    if (keyword === 'ADD' && /(^|\s)<<-?["']?[A-Za-z_]/.test(ins.getArgumentsContent() ?? ''))
      throw new DockerfileError('ADD <<EOF (a heredoc) is not supported: use COPY <<EOF, which makes the same file', lineNo);
    // dockerfile-ast reads heredocs of RUN and COPY (not of ADD: its body lines would fail as unknown instructions).
    const found = ins instanceof Run || ins instanceof Copy ? ins.getHeredocs() : [];
    const heredocs: Heredoc[] = [];
    // The command part ends where the line of the first `<<` marker ends (it may be continued); the bodies follow.
    let commandEnd = found.length ? found[0]!.getStartRange().start.line : end;
    while (found.length && commandEnd < end && continues(lines[commandEnd]!, escape)) commandEnd++;
    const joined = joinLines(lines.slice(start, commandEnd + 1), escape);
    const args = joined.replace(/^\s*\S+\s*/, '').trim();
    for (const h of found) {
      const delimiter = h.getDelimiterRange();
      if (!delimiter)
        throw new DockerfileError(
          `heredoc <<${h.getName()} is never closed: end it with a line "${h.getName()}" (a body line ending in ${escape} just before that line hides it)`,
          lineNo,
        );
      const contentRange = h.getContentRange();
      const marker = lines[h.getStartRange().start.line]!.slice(h.getStartRange().start.character);
      const stripTabs = marker.startsWith('<<-');
      let content = contentRange
        ? lines
            .slice(contentRange.start.line, contentRange.end.line + 1)
            .map((l) => `${l}\n`)
            .join('')
        : '';
      if (stripTabs) content = content.replace(/^\t+/gm, '');
      heredocs.push({ name: h.getName(), content, stripTabs, quoted: /^<<-?["']/.test(marker) });
    }
    const script = found.length ? [args, ...lines.slice(commandEnd + 1, end + 1)].join('\n') + '\n' : undefined;
    return { keyword, args, original: `${keyword} ${args}`.trim(), line: lineNo, escape, heredocs, ...(script ? { script } : {}) };
  });
}

/** The escape character an instruction was parsed with. */
export function escapeOf(ins: Instruction): string {
  return ins.escape;
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

/**
 * Substitutes $VAR, ${VAR}, ${VAR:-word} and ${VAR:+word} in the body of an unquoted COPY heredoc;
 * quotes are content there, and `\$` keeps a literal `$`.
 */
export function expandHeredoc(content: string, vars: ReadonlyMap<string, string>): string {
  return content.replace(
    /\\\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)/g,
    (m, braced?: string, op?: string, word?: string, bare?: string) => {
      if (m === '\\$') return '$';
      const v = vars.get((braced ?? bare)!);
      if (op === '-') return v !== undefined && v !== '' ? v : expandHeredoc(word ?? '', vars);
      if (op === '+') return v !== undefined && v !== '' ? expandHeredoc(word ?? '', vars) : '';
      return v ?? '';
    },
  );
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
