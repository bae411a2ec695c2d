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
      name: 'edge-protocol-is-a-leaf',
      severity: 'error',
      comment:
        'edge/protocol/ is the wire contract between the control plane and the edge: it imports no edge module, so nothing of the edge leaks into it and no circle runs through it (edge/protocol/README.md).',
      from: { path: '^packages/dsec/src/edge/protocol/' },
      to: { path: '^packages/dsec/src/edge/', pathNot: '^packages/dsec/src/edge/protocol/' },
    },
    {
      name: 'edge-not-into-control',
      severity: 'error',
      comment: 'The edge reaches the control plane only through the edge protocol (eslint has the same rule for value imports).',
      from: { path: '^packages/dsec/src/edge/' },
      to: { path: '^packages/dsec/src/control/' },
    },
    {
      name: 'edge-node-drives-no-backend',
      severity: 'error',
      comment:
        'edge/node/ is what every backend shares (layers, admission, capacity, volumes, network requests): it knows no backend; edge/edge.ts composes both (edge/node/README.md).',
      from: { path: '^packages/dsec/src/edge/node/' },
      to: { path: '^packages/dsec/src/edge/(backends/|server/|edge\\.ts$)' },
    },
    {
      name: 'edge-backends-not-into-each-other',
      severity: 'error',
      comment:
        'A backend imports no other backend: what two share lives in backends/shared/ (or edge/node/). FnCall is the one built on another: its workers are container sandboxes (edge/backends/README.md).',
      from: { path: '^packages/dsec/src/edge/backends/(container|vm|shared)/' },
      to: { path: '^packages/dsec/src/edge/backends/(container|vm|fncall)/', pathNot: '^packages/dsec/src/edge/backends/$1/' },
    },
    {
      name: 'edge-backends-shared-is-backend-neutral',
      severity: 'error',
      comment: 'backends/shared/ is what more than one backend uses: it imports no backend.',
      from: { path: '^packages/dsec/src/edge/backends/shared/' },
      to: { path: '^packages/dsec/src/edge/backends/(container|vm|fncall)/' },
    },
    {
      name: 'edge-backends-not-into-the-node-composition',
      severity: 'error',
      comment: 'Backends are driven by edge/edge.ts (and served by edge/server/): they import neither.',
      from: { path: '^packages/dsec/src/edge/backends/' },
      to: { path: '^packages/dsec/src/edge/(server/|edge\\.ts$)' },
    },
    {
      name: 'outside-the-edge-through-its-front',
      severity: 'error',
      comment:
        'Code outside the edge (control/, runtime/, cli/, image/, net/, host/, http/) reaches the edge through edge/protocol/, edge/edge.ts, edge/server/, edge/node/ blob sources and lazy threads; backends are the edge\'s own (bench and tests may reach further).',
      from: { path: '^packages/dsec/src/(control|cli|image|net|host|http)/' },
      to: { path: '^packages/dsec/src/edge/backends/' },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: ['dist/', '\\.test\\.ts$', '/test/'] },
    tsPreCompilationDeps: true,
    
    enhancedResolveOptions: { extensions: ['.ts', '.js'] },
  },
};
