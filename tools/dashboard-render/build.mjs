// Bundles src/main.tsx into dist/ (index.html + main.js) for tests/dashboards/test_render.py.
import { build } from 'esbuild';
import { copyFile, mkdir } from 'node:fs/promises';
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(import.meta.url);
const here = path.dirname(new URL(import.meta.url).pathname);

await mkdir(path.join(here, 'dist'), { recursive: true });
await build({
  entryPoints: [path.join(here, 'src', 'main.tsx')],
  outfile: path.join(here, 'dist', 'main.js'),
  bundle: true,
  format: 'iife',
  platform: 'browser',
  target: 'es2020',
  jsx: 'automatic',
  minify: true,
  legalComments: 'none',
  logLevel: 'warning',
  loader: { '.woff': 'empty', '.woff2': 'empty', '.ttf': 'empty', '.svg': 'dataurl', '.png': 'dataurl' },
  // Perses' packages import react-query through ESM and CommonJS entry points: one copy only, or
  // the panels find "No QueryClient set" (two React contexts)
  alias: { '@tanstack/react-query': require.resolve('@tanstack/react-query') },
  define: { global: 'globalThis', 'process.env.NODE_ENV': '"production"' },
});
await copyFile(path.join(here, 'src', 'index.html'), path.join(here, 'dist', 'index.html'));
