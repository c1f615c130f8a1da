// Builds the console into dist/ from src/ and the locked npm packages.
// The output is byte-for-byte reproducible: the Go test TestDistInSync
// rebuilds it and compares with the committed dist/.
import * as esbuild from 'esbuild';
import { copyFileSync, mkdirSync, rmSync } from 'node:fs';

const out = process.argv[2] || 'dist';
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
await esbuild.build({
  entryPoints: { app: 'src/main.jsx' },
  bundle: true,
  minify: true,
  format: 'iife',
  target: ['chrome110', 'firefox110', 'safari16'],
  jsx: 'automatic',
  jsxImportSource: 'preact',
  outdir: out,
  legalComments: 'external',
  charset: 'utf8',
  logLevel: 'warning',
});
copyFileSync('src/index.html', `${out}/index.html`);
copyFileSync('src/icon.svg', `${out}/icon.svg`);
