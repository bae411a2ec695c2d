// Import rules that lint runs (scripts/test, `npm run lint`): no circles, counting type-only
// imports (a type that crosses a boundary on the wrong side of it is how a circle starts, and
// eslint's import plugins skip them), and the folder boundaries each folder's README states.
/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      severity: 'error',
      comment: 'Two modules that import each other are one concept split badly, or a shared type lives on the wrong side.',
      from: {},
      to: { circular: true },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: ['dist/', '\\.test\\.ts$', '/test/'] },
    tsPreCompilationDeps: true,
    
    enhancedResolveOptions: { extensions: ['.ts', '.js'] },
  },
};
