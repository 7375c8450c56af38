#!/usr/bin/env bash
# Packs what bench/gpu.sh needs on a bare GPU machine that reaches no network into .gpu/
# (ignored by git, at most 64 MiB so the device tool can carry it):
#   .gpu/deno.xz      this machine's deno binary, xz-compressed (about 31 MB)
#   .gpu/deno_dir/    a DENO_DIR holding the npm packages the GPU tests import (deno-std only)
#   .gpu/models/      the model files the greedy fixtures read (stories260K and its compat
#                     carriers, the two tinyllama-like K-quant files) with llama.cpp's outputs
# The real-proportioned perf files (400-800 MB) do not fit: gpu.sh builds their shapes, with
# each tensor in the file's encoding, in memory instead (bench/perf_shapes.ts).
#
#   bash bench/gpu_pack.sh                    # MODEL_MIRROR defaults to ../shared/models
# then, with the device tool: run "bash bench/gpu.sh" carrying [".gpu"].
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_MIRROR="${MODEL_MIRROR:-../shared/models}"
out=.gpu
if [[ -n "${DENO_BIN:-}" ]]; then :; elif command -v deno >/dev/null; then DENO_BIN=$(command -v deno); else
  DENO_BIN=$(npx -y deno@2.9.6 eval 'console.log(Deno.execPath())')
fi
version=$("$DENO_BIN" --version | head -1)
[[ "$version" == "deno 2.9."* ]] || { echo "gpu_pack: need deno 2.9.x, $DENO_BIN is '$version'" >&2; exit 1; }

mkdir -p "$out/models/compat"
# The binary is the slow part (about 2 min of CPU): reuse it while it is this binary's.
stamp="$(stat -c %s "$DENO_BIN") $version"
if [[ ! -f "$out/deno.xz" || "$(cat "$out/deno.stamp" 2>/dev/null)" != "$stamp" ]]; then
  echo "compressing $DENO_BIN ($version)"
  xz -T0 -6 -c "$DENO_BIN" > "$out/deno.xz.part" && mv "$out/deno.xz.part" "$out/deno.xz"
  echo "$stamp" > "$out/deno.stamp"
fi

files=(stories260K.bin stories260K.gguf stories260K-q8_0.gguf)
for stem in stories260K-bf16 stories260K-q4_1 stories260K-q5_1 tinyllama-like-q4_k_m tinyllama-like-q5_k_m; do
  files+=("compat/$stem.gguf" "compat/$stem.llama_cpp.json")
done
files+=(compat/prompts-set1.json)
for f in "${files[@]}"; do
  [[ -f "$MODEL_MIRROR/$f" ]] || { echo "gpu_pack: $MODEL_MIRROR/$f is missing (set MODEL_MIRROR)" >&2; exit 1; }
  cp -u "$MODEL_MIRROR/$f" "$out/models/$f"
done

# deno.json's import map and lock name every package the project uses (300 MB of them); the
# GPU checks import deno-std alone, so they run under a config that maps just that.
"$DENO_BIN" eval --no-config '
  const c = JSON.parse(Deno.readTextFileSync("deno.json"));
  const imports = { "@std/assert": c.imports["@std/assert"] };
  const gpu = { compilerOptions: c.compilerOptions, unstable: c.unstable, imports, lock: false };
  Deno.writeTextFileSync(".gpu/deno.json", JSON.stringify(gpu, null, 2) + "\n");'
rm -rf "$out/deno_dir"
DENO_DIR="$out/deno_dir" "$DENO_BIN" cache --quiet --config "$out/deno.json" tests/webgpu_engine_test.ts tests/compat_llama_cpp_webgpu_test.ts tests/matmul_test.ts \
  tests/kernels_test.ts tests/attention_test.ts tests/sample_test.ts bench/kernels_bench.ts \
  bench/matmul_formats_bench.ts bench/adapter_info.ts
rm -rf "$out/deno_dir/gen" # compiled TypeScript: rebuilt there, and not small

bytes=$(du -sb "$out" | cut -f1)
limit=$((64 << 20))
echo "packed $out: $((bytes >> 20)) MiB of $((limit >> 20)) MiB"
(( bytes <= limit )) || { echo "gpu_pack: $out is over the device tool's carry limit" >&2; exit 1; }
