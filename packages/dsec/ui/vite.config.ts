import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

// The dashboard builds into the dsec package's dist/ui, which the control plane serves at /ui/.
// Relative asset paths (base './') keep it working behind a proxy that mounts /ui elsewhere.
export default defineConfig({
  root: fileURLToPath(new URL('.', import.meta.url)),
  base: './',
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  build: {
    outDir: fileURLToPath(new URL('../dist/ui', import.meta.url)),
    emptyOutDir: true,
    sourcemap: true,
    chunkSizeWarningLimit: 800,
  },
});
