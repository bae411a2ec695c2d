import AjvModule, { type Options } from 'ajv';
import addFormatsModule from 'ajv-formats';
import type { FastifySchemaCompiler } from 'fastify';

// Both are CommonJS with the class / plugin as `exports.default`.
const Ajv = AjvModule.default;
const addFormats = addFormatsModule.default;

/** Fastify's own defaults (@fastify/ajv-compiler), which dsec's schemas were written against. */
const COMMON: Options = { useDefaults: true, removeAdditional: false, addUsedSchema: false, allErrors: false };

/**
 * Request validation with type coercion where text is all there is, and none where JSON has types.
 * A URL's query string, path parameters and headers are strings, so `?limit=10` must become a
 * number. A JSON body says what it means: `{"cmd": 123}` is a mistake to refuse with a 400, not
 * a command "123" to run (coercion would also turn `true` into "true" and 1 into a one-element
 * array). One Fastify setting applies coercion to every part alike, hence two Ajv instances.
 */
export function requestValidatorCompiler(): FastifySchemaCompiler<unknown> {
  const coercing = addFormats(new Ajv({ ...COMMON, coerceTypes: 'array' }));
  const exact = addFormats(new Ajv({ ...COMMON, coerceTypes: false }));
  return ({ schema, httpPart }) => {
    if (httpPart === 'body') return exact.compile(schema as object) as ReturnType<FastifySchemaCompiler<unknown>>;
    return finiteOnly(coercing.compile(schema as object));
  };
}

type Validate = ((data: unknown) => boolean) & { errors?: unknown[] | null };

/**
 * Ajv's coercion turns `?limit=1e999` (or `Infinity`) into Infinity, which then passes `integer`,
 * `minimum` and `maximum` alike: a list answered 500 (`LIMIT Infinity` in its SQL), a trajectory
 * page 500, a terminal opened `cols` wide. No query, path or header value dsec takes is meant to
 * be infinite, so a coerced one that is not finite is refused as Ajv refuses a bad value.
 */
function finiteOnly(validate: Validate): ReturnType<FastifySchemaCompiler<unknown>> {
  const checked: Validate = (data) => {
    if (!validate(data)) {
      checked.errors = validate.errors ?? null;
      return false;
    }
    const field = nonFinite(data);
    if (field === undefined) {
      checked.errors = null;
      return true;
    }
    checked.errors = [
      { instancePath: `/${field}`, schemaPath: '#/type', keyword: 'type', params: { type: 'number' }, message: 'must be a finite number' },
    ];
    return false;
  };
  return checked as ReturnType<FastifySchemaCompiler<unknown>>;
}

/** The first key (of a query, params or headers object) whose value, or an item of it, is a number that is not finite. */
function nonFinite(data: unknown): string | undefined {
  if (typeof data !== 'object' || data === null) return undefined;
  for (const [key, value] of Object.entries(data)) {
    if (typeof value === 'number' && !Number.isFinite(value)) return key;
    if (Array.isArray(value) && value.some((v) => typeof v === 'number' && !Number.isFinite(v))) return key;
  }
  return undefined;
}
