import tseslint from 'typescript-eslint';

// dsec never imports the benchmark suite (packages/bench): `dsec bench` runs its CLI as a child.
const NO_BENCH = {
  group: ['@dsec/bench', '@dsec/bench/*', '**/packages/bench/**', '**/bench/src/**', '**/bench/dist/**'],
  message: 'dsec does not import the benchmark suite (packages/bench); `dsec bench` runs its CLI (cli/commands/bench.ts).',
};

export default tseslint.config(
  { ignores: ['**/dist/**', '**/node_modules/**', 'scripts/**', 'bench/**'] },
  ...tseslint.configs.recommended,
  {
    files: ['packages/**/*.ts'],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/consistent-type-imports': ['error', { fixStyle: 'inline-type-imports' }],
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', destructuredArrayIgnorePattern: '^_' },
      ],
    },
  },
  {
    files: ['packages/dsec/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: [NO_BENCH] }] },
  },
  {
    // The bench is built on the SDK and dsec's entry points (packages/dsec/package.json "exports",
    // src/entry/): nothing else of dsec, so dsec's insides can move without breaking it.
    files: ['packages/bench/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              regex: '^dsec(/(?!(runtime|host|container|edge|cluster)$).*)?$',
              message:
                'the bench imports dsec only through its entry points: dsec/runtime, dsec/host, dsec/container, dsec/edge, dsec/cluster (packages/dsec/src/entry/).',
            },
            {
              group: ['**/dsec/src/**', '**/dsec/dist/**', '**/packages/dsec/**', '../../dsec/**', '../../../dsec/**'],
              message: 'the bench imports dsec only through its entry points (`dsec/<name>`), never by path.',
            },
          ],
        },
      ],
    },
  },
  {
    // Folder boundaries (each folder's README says what it may import; these hold the ones that
    // keep the daemons apart). http/ is the kit both servers share: it knows no daemon.
    files: ['packages/dsec/src/http/**/*.ts'],
    ignores: ['**/*.test.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              group: ['**/control/**', '**/edge/**', '**/runtime/**', '**/image/**', '**/net/**', '**/cli/**'],
              message: 'http/ is shared by the control plane and the edge: it imports neither (see http/README.md).',
            },
            NO_BENCH,
          ],
        },
      ],
    },
  },
  {
    // The edge never reaches into the control plane: the edge protocol is its only contract with it.
    files: ['packages/dsec/src/edge/**/*.ts', 'packages/dsec/src/net/**/*.ts', 'packages/dsec/src/host/**/*.ts'],
    ignores: ['**/*.test.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              group: ['**/control/**'],
              message:
                'the edge (the container backend exec/ included; net/, host/) does not import the control plane: share through http/ or edge/protocol/.',
            },
            NO_BENCH,
          ],
        },
      ],
    },
  },
  {
    // node:test's describe()/test() return promises the runner itself awaits.
    files: ['**/*.test.ts', 'packages/dsec/test/**/*.ts'],
    rules: { '@typescript-eslint/no-floating-promises': 'off' },
  },
);
