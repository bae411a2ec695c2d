export * from './common.js';
export * from './sandbox.js';
export * from './exec.js';
export * from './files.js';
export * from './image.js';
