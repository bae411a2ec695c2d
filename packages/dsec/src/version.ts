import { createRequire } from 'node:module';

/** dsec's version, from its package.json (dist/src/version.js → ../../package.json). */
export const DSEC_VERSION: string = (createRequire(import.meta.url)('../../package.json') as { version: string }).version;
