// Bundles the playground's script and its editor into the one file `pml serve` embeds
// (crates/pml-server/assets/playground/app.js). Deterministic: the same sources and lockfile give
// the same bytes, which `node build.mjs --check` compares with the committed bundle.
import { build } from "esbuild";
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
const out = here("../../crates/pml-server/assets/playground/app.js");

const result = await build({
  entryPoints: [here("src/main.js")],
  bundle: true,
  format: "iife",
  target: "es2020",
  minify: true,
  legalComments: "inline",
  write: false,
});
const bundled = result.outputFiles[0].text;
if (process.argv.includes("--check")) {
  const committed = readFileSync(out, "utf8");
  if (committed !== bundled) {
    console.error("app.js is stale: run `npm ci && node build.mjs` in web/playground");
    process.exit(1);
  }
  console.log("app.js matches its sources");
} else {
  writeFileSync(out, bundled);
  console.log(`wrote ${out} (${bundled.length} bytes)`);
}
