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
  return ({ schema, httpPart }) =>
    (httpPart === 'body' ? exact : coercing).compile(schema as object) as ReturnType<FastifySchemaCompiler<unknown>>;
}
