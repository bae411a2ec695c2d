/**
 * What a session carries from one command to the next (see shell-session.ts): the working
 * directory and a script, written by the shell itself after a command, that recreates its
 * variables (exported or not, with bash's attributes and arrays), bash functions, aliases and
 * options in the next command's fresh shell. busybox ash and dash cannot list their functions,
 * so sh sessions carry cwd, variables and exports only.
 */
export interface SessionState {
  cwd: string;
  script: string;
}

function q(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/**
 * Printed by the command's shell after the command: on fd 3 the command's status and the state,
 * closed with `stateEnd`, then the end markers on stdout and stderr, then the command's status
 * again as the shell's exit status. The edge answers from fd 3 as soon as the markers are in
 * (shell-session.ts): the shell's exit, and its starter's after it, are off the answer's path.
 * fd 3 is the shell's alone (the command runs without it, in a Landlock domain of its own), so
 * what it says is as much the shell's word as its exit status. Everything is a builtin (bash:
 * `builtin`, so a function named like one is not run).
 */
export function saveScript(bash: boolean, marker: string, stateEnd: string): string {
  if (bash) {
    return [
      'builtin set -- "$?"',
      // The options are in declare -p's BASHOPTS and SHELLOPTS (restoreBashOptions), not listed
      // one a line by shopt -p and set +o: bash writes each line of a builtin's output alone, and
      // those 84 writes and their 84 statements took ~1 ms of the command's CPU.
      `{ builtin printf '%s\\0%s\\0' "$1" "$PWD"; builtin declare -p; builtin declare -f; builtin alias -p; builtin printf '\\n%s\\n' ${q(stateEnd)}; } >&3 2>/dev/null`,
      'builtin exec 3>&-',
      `builtin printf '\\n%s\\n' ${q(marker)}; builtin printf '\\n%s\\n' ${q(marker)} >&2`,
      'builtin exit "$1"',
    ].join('\n');
  }
  return [
    'set -- "$?"',
    `{ printf '%s\\0%s\\0' "$1" "$PWD"; set; export -p; printf '\\n%s\\n' ${q(stateEnd)}; } >&3 2>/dev/null`,
    'exec 3>&-',
    `printf '\\n%s\\n' ${q(marker)}; printf '\\n%s\\n' ${q(marker)} >&2`,
    'exit "$1"',
  ].join('\n');
}

/** Variables a fresh sh sets itself, some read-only (assigning one would end a POSIX shell). */
const SH_OWN_VARIABLES = new Set(['PPID', 'LINENO', 'OPTIND', 'RANDOM', 'SECONDS', 'HOSTNAME', 'UID', 'EUID', 'GROUPS', '_']);

/**
 * Drops the assignments of `SH_OWN_VARIABLES` from sh's `set` output. Each assignment is
 * `NAME=value` with the value single-quoted (newlines inside quotes), so the split respects quotes.
 */
function withoutShellOwn(script: string): string {
  const out: string[] = [];
  let i = 0;
  while (i < script.length) {
    let j = i;
    let quoted = false;
    while (j < script.length && (quoted || script[j] !== '\n')) {
      if (script[j] === "'") quoted = !quoted;
      else if (script[j] === '\\' && !quoted) j++;
      j++;
    }
    const statement = script.slice(i, j);
    const name = /^([A-Za-z_][A-Za-z0-9_]*)=/.exec(statement)?.[1];
    if (!name || !SH_OWN_VARIABLES.has(name)) out.push(statement);
    i = j + 1;
  }
  return out.join('\n');
}

/** bash's read-only variables: restoring one fails (quietly), whatever it says. */
const BASH_READ_ONLY = new Set(['BASHOPTS', 'BASH_VERSINFO', 'EUID', 'PPID', 'SHELLOPTS', 'UID']);

/** Set anew by the commands that run before the session's command (the last argument, each pipeline's statuses). */
const BASH_OVERWRITTEN = new Set(['_', 'PIPESTATUS']);

/**
 * bash's dynamic variables (listed without a value) and internal arrays, exactly as a fresh bash
 * lists them: declaring them again in a fresh bash changes nothing. Any other form (a value the
 * session gave one, an attribute it added) is restored.
 */
const BASH_AS_FRESH = new Set([
  'declare -i BASHPID',
  'declare -- BASH_ARGV0',
  'declare -- BASH_COMMAND',
  'declare -- BASH_SUBSHELL',
  'declare -- COMP_WORDBREAKS',
  'declare -- EPOCHREALTIME',
  'declare -- EPOCHSECONDS',
  'declare -a FUNCNAME',
  'declare -i HISTCMD',
  'declare -- LINENO',
  'declare -i RANDOM',
  'declare -- SECONDS',
  'declare -i SRANDOM',
  'declare -A BASH_ALIASES=()',
  'declare -a BASH_ARGC=()',
  'declare -a BASH_ARGV=()',
  'declare -A BASH_CMDS=()',
  'declare -a BASH_LINENO=()',
  'declare -a BASH_SOURCE=()',
  'declare -a DIRSTACK=()',
  'declare -a GROUPS=()',
]);

function isBashOwn(statement: string): boolean {
  if (BASH_AS_FRESH.has(statement)) return true;
  const name = /^declare -[A-Za-z-]+ ([A-Za-z_][A-Za-z0-9_]*)(?:=|$)/.exec(statement)?.[1];
  return name !== undefined && (BASH_READ_ONLY.has(name) || BASH_OVERWRITTEN.has(name));
}

/**
 * Where the statement of `declare -p` output that starts at `i` ends (its newline, or the end):
 * a value is double-quoted (a backslash escapes the next character) or $'…' (likewise), arrays
 * hold such values, and a newline inside quotes is part of the value.
 */
function declareEnd(script: string, i: number): number {
  let quote: string | undefined; // the character that closes the open quote
  let escapes = false;
  for (let j = i; j < script.length; j++) {
    const c = script[j];
    if (quote === undefined) {
      if (c === '\n') return j;
      if (c === '\\') j++;
      else if (c === '"' || c === "'") [quote, escapes] = [c, c === '"'];
      else if (c === '$' && script[j + 1] === "'") [quote, escapes, j] = ["'", true, j + 1];
    } else if (escapes && c === '\\') j++;
    else if (c === quote) quote = undefined;
  }
  return script.length;
}

/**
 * Drops from bash's saved state the statements of bash's own variables that a fresh bash has
 * as they are (or cannot take): 29 of the 47 statements of a session that set nothing, each
 * ~6 µs of the next command's shell. Only the `declare -p`
 * statements at the start are looked at; the functions, aliases and options after them are kept
 * as they are.
 */
export function withoutBashOwn(script: string): string {
  const kept: string[] = [];
  let i = 0;
  for (const { statement, end } of declareStatements(script)) {
    if (!isBashOwn(statement)) kept.push(statement);
    i = end + 1;
  }
  if (i < script.length) kept.push(script.slice(i));
  return kept.join('\n');
}

/** The `declare -p` statements at the start of a bash state script, each with where it ends. */
function* declareStatements(script: string): Generator<{ statement: string; end: number }> {
  let i = 0;
  while (i < script.length && script.startsWith('declare -', i)) {
    const end = declareEnd(script, i);
    yield { statement: script.slice(i, end), end };
    i = end + 1;
  }
}

/** The options a bash state had on, from its BASHOPTS (shopt's) and SHELLOPTS (set -o's); undefined where it has none. */
function savedBashOptions(script: string): { shopt?: string[]; set?: string[] } {
  const found: { shopt?: string[]; set?: string[] } = {};
  for (const { statement } of declareStatements(script)) {
    const m = /^declare -[a-z]*r[a-z]* (BASHOPTS|SHELLOPTS)="([a-z0-9_:-]*)"$/.exec(statement);
    if (m) found[m[1] === 'BASHOPTS' ? 'shopt' : 'set'] = m[2]!.split(':').filter(Boolean);
  }
  return found;
}

/**
 * Sets a fresh bash's options as the saved state had them: every option that is on (in the fresh
 * shell's own BASHOPTS or SHELLOPTS) and was not is turned off, then every saved one on. Without
 * a word split (the restored IFS may be anything) or a command a restored function could stand
 * in for. After the variables, functions and aliases, as shopt -p and set +o used to be: an
 * errexit or nounset restored earlier would apply to the rest of the restore.
 */
function restoreBashOptions(script: string): string[] {
  const saved = savedBashOptions(script);
  const lines: string[] = [];
  for (const [kind, live, turnOff, turnOn] of [
    ['shopt', 'BASHOPTS', 'builtin shopt -u', (names: string[]) => `builtin shopt -s ${names.join(' ')}`],
    ['set', 'SHELLOPTS', 'builtin set +o', (names: string[]) => `builtin set ${names.map((n) => `-o ${n}`).join(' ')}`],
  ] as const) {
    const names = saved[kind];
    if (!names) continue;
    lines.push(
      `__dsec_on=${q(`:${names.join(':')}:`)}; __dsec_o=$${live}:`,
      `while [[ -n $__dsec_o ]]; do [[ $__dsec_on == *":\${__dsec_o%%:*}:"* ]] || ${turnOff} "\${__dsec_o%%:*}"; __dsec_o=\${__dsec_o#*:}; done`,
    );
    // Never a bare `shopt -s` or `set`: with no names they list the options (the variables) instead.
    if (names.length) lines.push(turnOn(names));
  }
  if (lines.length) lines.push('builtin unset __dsec_on __dsec_o');
  // One group, parsed whole before any of it runs: an alias the state defined, or an
  // expand_aliases it turns on, cannot change what these lines are.
  return lines.length ? ['{', ...lines, '} 2>/dev/null'] : [];
}

/**
 * Recreates `state` at the start of the next command (nothing before the first one). The command
 * starts with an empty environment but crun adds HOME when it is missing: unset it first, so an
 * `unset HOME` in the session holds (the state sets it again if it had it).
 */
export function restoreScript(bash: boolean, state: SessionState | undefined): string {
  if (!state) return '';
  if (bash) {
    return [
      `builtin unset HOME; __dsec_state=${q(withoutBashOwn(state.script))}`,
      'builtin eval "$__dsec_state" 2>/dev/null; builtin unset __dsec_state',
      ...restoreBashOptions(state.script),
      `builtin cd -- ${q(state.cwd)} 2>/dev/null || :`,
    ].join('\n');
  }
  return [
    `unset HOME; __dsec_state=${q(withoutShellOwn(state.script))}`,
    'eval "$__dsec_state" 2>/dev/null; unset __dsec_state',
    `cd -- ${q(state.cwd)} 2>/dev/null || :`,
  ].join('\n');
}

/** The command's status and the state its shell wrote on fd 3, if it got as far as writing all of it. */
export function parseSavedState(raw: Buffer, stateEnd: string): { state: SessionState; exitCode: number } | undefined {
  const text = raw.toString('utf8');
  const end = text.lastIndexOf(`\n${stateEnd}\n`);
  if (end < 0) return undefined;
  const afterStatus = text.indexOf('\0');
  const afterCwd = afterStatus < 0 ? -1 : text.indexOf('\0', afterStatus + 1);
  if (afterCwd < 0 || afterCwd > end) return undefined;
  const status = text.slice(0, afterStatus);
  if (!/^\d{1,3}$/.test(status)) return undefined;
  return { exitCode: Number(status), state: { cwd: text.slice(afterStatus + 1, afterCwd), script: text.slice(afterCwd + 1, end) } };
}
