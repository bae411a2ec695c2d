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
      name: 'edges-only-through-services',
      severity: 'error',
      comment:
        'Routes, the E2B layer and the port proxy call services (control/service/), which take the caller and decide project scope; ' +
        "only services reach an edge. They may use the edge protocol's types, never an edge client or the lookup that finds one.",
      from: { path: '^packages/dsec/src/control/(routes|e2b|ports)/' },
      to: { path: ['^packages/dsec/src/control/edges/', '^packages/dsec/src/control/service/sandbox-lookup\\.ts$'] },
    },
    {
      name: 'sandbox-lookup-is-private-to-services',
      severity: 'error',
      comment:
        'SandboxLookup is how a service finds a sandbox for a caller and reaches its edge: nothing outside service/ (and the composition root) uses it.',
      from: {
        path: '^packages/dsec/src/',
        pathNot: ['^packages/dsec/src/control/service/', '^packages/dsec/src/control/control-plane\\.ts$'],
      },
      to: { path: '^packages/dsec/src/control/service/sandbox-lookup\\.ts$' },
    },
    {
      name: 'image-below-the-platform',
      severity: 'error',
      comment:
        'image/ (layers, images, builders, import, registry client) sits below the platform that runs it: it imports nothing of control/, edge/, runtime/, cli/, bench/ (nor net/, http/, config/), only itself, host/ and api-error.ts (and the SDK package). What a Dockerfile build needs from the platform is an interface image/ declares (BuildSandboxes, image/dockerfile/sandboxes.ts) that control/ implements (control/build-sandboxes.ts). image/README.md states it.',
      from: { path: '^packages/dsec/src/image/' },
      to: { path: '^packages/dsec/src/', pathNot: ['^packages/dsec/src/(image|host)/', '^packages/dsec/src/api-error\\.ts$'] },
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
    {
      name: 'layers-point-down',
      severity: 'error',
      comment:
        'The daemons and what they stand on never import what stands on them: runtime/ wires the daemons, cli/ (and its demo/, the main job) drives them, entry/ exports them to the bench. ' +
        'See packages/dsec/src/README.md for the layers.',
      from: { path: '^packages/dsec/src/(edge|net|host|http|image|config|control)/' },
      to: { path: '^packages/dsec/src/(runtime|cli|entry)/' },
    },
    {
      name: 'edge-never-imports-control',
      severity: 'error',
      comment: "The edge protocol is the edge daemon's only contract with the control plane (eslint holds the same rule).",
      from: { path: '^packages/dsec/src/(edge|net|host)/' },
      to: { path: '^packages/dsec/src/control/' },
    },
    {
      name: 'control-reaches-edges-by-contract',
      severity: 'error',
      comment: "The control plane knows an edge only by its contract: EdgeApi and the wire protocol, never the edge's own modules.",
      from: { path: '^packages/dsec/src/control/' },
      to: { path: '^packages/dsec/src/edge/', pathNot: ['^packages/dsec/src/edge/protocol/'] },
    },
    {
      name: 'host-is-the-floor',
      severity: 'error',
      comment: 'host/ (syscalls, cgroups, mounts, tools, the spawn helper) is what everything stands on: it imports nothing else of dsec.',
      from: { path: '^packages/dsec/src/host/' },
      to: { path: '^packages/dsec/src/', pathNot: ['^packages/dsec/src/host/', '^packages/dsec/src/(api-error|version)\\.ts$'] },
    },
    {
      name: 'net-stands-on-host',
      severity: 'error',
      comment: 'net/ (addresses, nftables, policies, netns) uses host/ only.',
      from: { path: '^packages/dsec/src/net/' },
      to: { path: '^packages/dsec/src/', pathNot: ['^packages/dsec/src/(net|host)/', '^packages/dsec/src/(api-error|version)\\.ts$'] },
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
        "Code outside the edge (control/, runtime/, cli/, image/, net/, host/, http/) reaches the edge through edge/protocol/, edge/edge.ts, edge/server/, edge/node/ blob sources and lazy threads; backends are the edge's own (bench and tests may reach further).",
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
