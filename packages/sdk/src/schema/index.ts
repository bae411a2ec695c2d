export * from './common.js';
export * from './sandbox.js';
export * from './exec.js';
export * from './files.js';
export * from './image.js';
export * from './session.js';
export * from './process.js';
export * from './trajectory.js';
