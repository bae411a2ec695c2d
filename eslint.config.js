import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['**/dist/**', '**/node_modules/**', 'scripts/**', 'bench/**'] },
  ...tseslint.configs.recommended,
  {
    files: ['packages/**/*.ts'],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/consistent-type-imports': ['error', { fixStyle: 'inline-type-imports' }],
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', destructuredArrayIgnorePattern: '^_' }],
    },
  },
  {
    // Folder boundaries (each folder's README says what it may import; these hold the ones that
    // keep the daemons apart). http/ is the kit both servers share: it knows no daemon.
    files: ['packages/dsec/src/http/**/*.ts'],
    ignores: ['**/*.test.ts'],
    rules: {
      'no-restricted-imports': ['error', { patterns: [{ group: ['**/control/**', '**/edge/**', '**/runtime/**', '**/image/**', '**/net/**', '**/bench/**', '**/cli/**'], message: 'http/ is shared by the control plane and the edge: it imports neither (see http/README.md).' }] }],
    },
  },
  {
    // The edge never reaches into the control plane: the edge protocol is its only contract with it.
    files: ['packages/dsec/src/edge/**/*.ts', 'packages/dsec/src/net/**/*.ts', 'packages/dsec/src/host/**/*.ts'],
    ignores: ['**/*.test.ts'],
    rules: {
      'no-restricted-imports': ['error', { patterns: [{ group: ['**/control/**'], message: 'the edge (the container backend exec/ included; net/, host/) does not import the control plane: share through http/ or edge/protocol/.' }] }],
    },
  },
  {
    // node:test's describe()/test() return promises the runner itself awaits.
    files: ['**/*.test.ts', 'packages/dsec/test/**/*.ts'],
    rules: { '@typescript-eslint/no-floating-promises': 'off' },
  },
);
