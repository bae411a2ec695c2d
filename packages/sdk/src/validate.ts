import type { TSchema } from 'typebox';
import { Compile, type Validator } from 'typebox/compile';
import { Value } from 'typebox/value';
import { InvalidRequestError } from './errors.js';

/**
 * Checks at the SDK's edge, before anything is sent: JavaScript callers (and TypeScript callers
 * with `any`) can pass a string where a number belongs or an object where bytes belong, and a
 * clear InvalidRequestError here beats a Node TypeError, `[object Object]` written to a file, or
 * `sh -c 123`.
 */

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  if (v instanceof Uint8Array) return 'bytes';
  if (typeof v === 'string') return `the string ${JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}…` : v)}`;
  if (typeof v === 'object') return `an object (${v.constructor?.name ?? 'Object'})`;
  return `${typeof v} ${String(v)}`;
}

function invalid(field: string, message: string): InvalidRequestError {
  return new InvalidRequestError(`${field} ${message}`, 'INVALID_REQUEST', undefined, { field });
}

/** A command: a non-empty shell string, or an argv of strings whose first item is not empty. */
export function checkCmd(cmd: unknown): asserts cmd is string | string[] {
  if (typeof cmd === 'string') {
    if (cmd === '') throw invalid('cmd', 'is empty: give a shell command line or an argv array');
    return;
  }
  if (Array.isArray(cmd)) {
    if (cmd.length === 0 || cmd[0] === '') throw invalid('cmd', 'is empty: an argv needs the program as its first item');
    const bad = cmd.findIndex((a) => typeof a !== 'string');
    if (bad !== -1) throw invalid(`cmd[${bad}]`, `must be a string, got ${describe(cmd[bad])}`);
    return;
  }
  throw invalid('cmd', `must be a shell command string or an argv array of strings, got ${describe(cmd)}`);
}

/** A path inside the sandbox: a non-empty string. */
export function checkPath(path: unknown, field = 'path'): asserts path is string {
  if (typeof path !== 'string' || path === '') throw invalid(field, `must be a non-empty string, got ${describe(path)}`);
}

/** File contents: a string (written as UTF-8) or bytes (Uint8Array, Buffer). */
export function checkData(data: unknown, field = 'data'): asserts data is string | Uint8Array {
  if (typeof data !== 'string' && !(data instanceof Uint8Array)) {
    throw invalid(field, `must be a string or a Uint8Array (Buffer), got ${describe(data)}; serialize objects first (e.g. JSON.stringify)`);
  }
}

/** Bytes only (a tar archive). */
export function checkBytes(data: unknown, field: string): asserts data is Uint8Array {
  if (!(data instanceof Uint8Array)) throw invalid(field, `must be a Uint8Array (Buffer), got ${describe(data)}`);
}

/** An optional whole number of milliseconds (or other count) ≥ min. */
export function checkOptionalInt(value: unknown, field: string, min = 0): void {
  if (value === undefined) return;
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min)
    throw invalid(field, `must be a whole number ≥ ${min}, got ${describe(value)}`);
}

/** An optional AbortSignal. */
export function checkSignal(signal: unknown): void {
  if (signal !== undefined && !(signal instanceof AbortSignal)) throw invalid('signal', `must be an AbortSignal, got ${describe(signal)}`);
}

/** JSON drops undefined-valued keys, so the check must not see them either. */
function withoutUndefined(v: unknown): unknown {
  if (typeof v !== 'object' || v === null || Array.isArray(v) || v instanceof Uint8Array) return v;
  return Object.fromEntries(
    Object.entries(v)
      .filter(([, x]) => x !== undefined)
      .map(([k, x]) => [k, withoutUndefined(x)]),
  );
}

/**
 * Each wire schema's compiled check, made at its first use: a body that passes (nearly every one)
 * costs a compiled check, where walking the schema for its errors took ~0.2 ms of every
 * commands.run in `dsec bench exec`'s profile. Only a body that fails is walked, for the message.
 * (TypeBox falls back to its interpreter where code cannot be generated.)
 */
const validators = new WeakMap<TSchema, Validator>();

function validatorOf(schema: TSchema): Validator {
  let v = validators.get(schema);
  if (!v) validators.set(schema, (v = Compile(schema)));
  return v;
}

/** Checks a request body against its wire schema (the server checks it again). */
export function checkBody(schema: TSchema, raw: unknown, what: string): void {
  const body = withoutUndefined(raw);
  if (validatorOf(schema).Check(body)) return;
  const errors = [...Value.Errors(schema, body)];
  const first = errors[0];
  if (!first) return;
  const path = first.instancePath.replace(/^\//, '').replace(/\//g, '.');
  if (first.schemaPath.endsWith('/additionalProperties') || first.keyword === 'additionalProperties') {
    const extra = (first.params as Record<string, unknown>)['additionalProperties'];
    throw invalid(Array.isArray(extra) ? String(extra[0]) : path, `is not an option of ${what}`);
  }
  let value: unknown = body;
  for (const part of path ? path.split('.') : []) value = (value as Record<string, unknown> | undefined)?.[part];
  // A union of literals fails once per literal: name them all.
  const allowed = errors
    .filter((e) => e.keyword === 'const' && e.instancePath === first.instancePath)
    .map((e) => (e.params as Record<string, unknown>)['allowedValue']);
  const message = allowed.length > 1 ? `must be one of ${allowed.map((a) => JSON.stringify(a)).join(', ')}` : first.message;
  throw invalid(path || what, `${message}, got ${describe(value)}`);
}
