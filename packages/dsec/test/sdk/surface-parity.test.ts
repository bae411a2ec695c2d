/**
 * The Python SDK at the TypeScript SDK's surface (docs/python.md promises it): both surfaces are
 * read from the packages themselves — the TypeScript classes' static and prototype methods and
 * getters as compiled, the Python classes' public attributes through `python3 -c` — and every
 * call one has must be in the other under the Python name (snake_case), or be named below with
 * the reason it differs. A call added to one SDK alone fails here until the other has it.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import * as sdk from '@dsec/sdk';

const PYTHON_DIR = resolve(fileURLToPath(import.meta.url), '../../../../../../python');
const PYTHON = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

/** TypeScript export → the Python class (or module) that carries the same calls. */
const PAIRS: Record<string, string> = {
  Sandbox: 'Sandbox',
  Commands: 'Commands',
  ProcessHandle: 'Process',
  Sessions: 'Sessions',
  Session: 'Session',
  Files: 'Files',
  Terminal: 'Terminal',
  Ports: 'Ports',
  Volume: 'Volume',
  Image: 'Image',
  Pool: 'Pool',
  fn: 'fn',
};

/**
 * Where the names differ by more than case, and why. Python cannot have a classmethod and an
 * instance method of one name, so the by-id forms of instance calls take a suffix.
 */
const RENAMED: Record<string, string> = {
  'Sandbox.createManyIter (static)': 'iter_create_many', // a generator, named verb-first as Python's iter_* are
  'Sandbox.kill (static)': 'kill_by_id',
  'Sandbox.trajectory (static)': 'trajectory_by_id',
  'Image.delete (static)': 'delete_by_ref',
  'Pool.delete (static)': 'delete_by_name',
};

/** Calls only one SDK has, each with the reason. Nothing else may be missing on either side. */
const ONLY_TYPESCRIPT: Record<string, string> = {
  'Image.fromSnapshot (static)': '@internal: how sb.snapshot() makes its handle',
  'Ports.websocket': "a browser-style WebSocket object is JavaScript's; Python opens ports.url(...) with its own client",
  'Ports.connect': 'a raw TCP stream as a Node Duplex (what `dsec port-forward` uses); Python: not yet',
};
const ONLY_PYTHON: Record<string, string> = {
  'Sandbox.batch_info': 'TypeScript exports it as a function, batchInfo()',
  'Files.upload_dir': 'a local directory as one tar (Python convenience over upload_tar)',
  'Files.download_dir': 'the reverse of upload_dir',
  'Process.follow': 'output as an iterator; TypeScript streams through commands.stream callbacks',
  'Terminal.read': 'Python reads output by pulling; TypeScript pushes it to onData',
  'Terminal.wait': 'TypeScript resolves terminal.exited instead',
  'Terminal.exit_code': 'the exit code once wait() returned; TypeScript resolves it from terminal.exited',
};

const snake = (name: string): string => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

/** `Class.member` (and ` (static)` for statics) of every TypeScript pair. */
function typescriptSurface(): Map<string, string> {
  const out = new Map<string, string>();
  for (const name of Object.keys(PAIRS)) {
    const value = (sdk as Record<string, unknown>)[name];
    assert.ok(value, `@dsec/sdk exports ${name}`);
    if (typeof value === 'function') {
      for (const m of Object.getOwnPropertyNames(value))
        if (!['length', 'name', 'prototype'].includes(m) && typeof (value as unknown as Record<string, unknown>)[m] === 'function')
          out.set(`${name}.${m} (static)`, m);
      for (const m of Object.getOwnPropertyNames((value as { prototype: object }).prototype))
        if (m !== 'constructor') out.set(`${name}.${m}`, m);
    } else {
      for (const m of Object.keys(value as object)) out.set(`${name}.${m}`, m);
    }
  }
  return out;
}

/** Python `Class.member` names of every pair, read from the installed-from-checkout package. */
function pythonSurface(): Set<string> {
  const script = [
    'import json, sys, types, inspect',
    'import dsec',
    `pairs = ${JSON.stringify(Object.values(PAIRS))}`,
    'out = []',
    'for p in pairs:',
    '    obj = getattr(dsec, p)',
    // A module's own functions, not what it imports.
    '    names = [n for n, v in vars(obj).items() if inspect.isfunction(v) and v.__module__ == obj.__name__] if isinstance(obj, types.ModuleType) else dir(obj)',
    '    out += [f"{p}.{n}" for n in names if not n.startswith("_")]',
    'print(json.dumps(out))',
  ].join('\n');
  const r = spawnSync(PYTHON, ['-c', script], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: PYTHON_DIR } });
  assert.equal(r.status, 0, r.stderr);
  return new Set(JSON.parse(r.stdout) as string[]);
}

const skip = spawnSync(PYTHON, ['--version']).status === 0 ? undefined : 'needs python3 (scripts/setup --tests installs it)';

test('every TypeScript SDK call has its Python counterpart, and every Python call its TypeScript one', { skip }, () => {
  const ts = typescriptSurface();
  const py = pythonSurface();
  const pyClass = (key: string): string => PAIRS[key.split('.')[0]!]!;
  const missingInPython: string[] = [];
  const matched = new Set<string>();
  for (const [key, member] of ts) {
    if (key in ONLY_TYPESCRIPT) continue;
    const pyName = `${pyClass(key)}.${RENAMED[key] ?? snake(member)}`;
    if (py.has(pyName)) matched.add(pyName);
    else missingInPython.push(`${key} → ${pyName}`);
  }
  const pyToTs = new Map(Object.entries(PAIRS).map(([t, p]) => [p, t]));
  const missingInTypescript = [...py].filter(
    (n) => !matched.has(n) && !(n in ONLY_PYTHON) && !isDataOrDunder(n) && !pyToTs.has(n.split('.')[1]!),
  );
  assert.deepEqual(missingInPython, [], 'TypeScript calls Python lacks (add them to python/dsec, or say why in ONLY_TYPESCRIPT)');
  assert.deepEqual(missingInTypescript, [], 'Python calls TypeScript lacks (add them to packages/sdk, or say why in ONLY_PYTHON)');
  // The lists of differences stay true: an entry whose call is gone (or now on both sides) goes.
  for (const key of Object.keys(ONLY_TYPESCRIPT))
    assert.ok(ts.has(key), `ONLY_TYPESCRIPT names ${key}, which the TypeScript SDK no longer has`);
  for (const key of Object.keys(ONLY_PYTHON)) assert.ok(py.has(key), `ONLY_PYTHON names ${key}, which the Python SDK no longer has`);
});

/** Attributes that are data, not calls: a handle's fields and the sub-APIs set in __init__ are not in dir() of the class. */
function isDataOrDunder(name: string): boolean {
  return ['info', 'id', 'name', 'sandbox_id'].includes(name.split('.')[1]!);
}
