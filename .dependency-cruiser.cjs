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
    {
      name: 'dsec-does-not-import-bench',
      severity: 'error',
      comment:
        'The benchmark suite (packages/bench) sits beside dsec: dsec never imports it; `dsec bench` runs its CLI as a child process.',
      from: { path: '^packages/(dsec|sdk)/' },
      to: { path: ['^packages/bench/', '^@dsec/bench(/|$)'] },
    },
    {
      name: 'bench-through-dsec-entry-points',
      severity: 'error',
      comment: 'The bench imports dsec only through the entry points in its exports map (packages/dsec/src/entry/, `dsec/<name>`).',
      from: { path: '^packages/bench/' },
      to: {
        path: ['^packages/dsec/', '^dsec(/|$)'],
        pathNot: ['^packages/dsec/src/entry/', '^dsec/(runtime|host|container|edge|cluster)$'],
      },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: ['dist/', '\\.test\\.ts$', '/test/'] },
    tsPreCompilationDeps: true,

    enhancedResolveOptions: { extensions: ['.ts', '.js'] },
  },
};
