#!/usr/bin/env bash
# WebGPU engine on a real GPU, in one go (about 5 minutes): the kernel tests, then the benchmark
# for stories260K (when the models directory is there), matmul GB/s for every tensor type, and a
# randomly initialised model of Llama-3.2-1B's shape in F16 and Q4_0 (built in memory by the
# benchmark). Prints markdown.
#
#   bench/gpu.sh                      # from the repository root or anywhere
#   DENO=/path/to/deno MODEL_MIRROR=/path/to/models bench/gpu.sh
#
# Needs a deno binary (2.9.x; `npx -y deno@2.9.6` is used when none is on PATH) and a WebGPU
# adapter (a Vulkan driver on Linux). The benchmark itself imports no packages, so it runs
# offline; the tests need deno's npm cache for @std/assert.
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${DENO:-}" ]]; then :; elif command -v deno >/dev/null; then DENO=deno; else DENO="npx -y deno@2.9.6"; fi
export MODEL_MIRROR="${MODEL_MIRROR:-../shared/models}"
BATCHES="${BATCHES:-1,16,64}"
status=0
step() { echo; echo "### $1"; echo; }

step "kernel tests"
tests=(tests/matmul_test.ts tests/kernels_test.ts tests/attention_test.ts tests/sample_test.ts)
[[ -f "$MODEL_MIRROR/stories260K.bin" ]] && tests+=(tests/webgpu_engine_test.ts)
timeout 150 $DENO test --allow-all "${tests[@]}" 2>&1 | grep -E "^(ok|FAILED)|passed|failed|error" || status=1

if [[ -f "$MODEL_MIRROR/stories260K.bin" ]]; then
  step "stories260K"
  timeout 60 $DENO run --allow-all bench/kernels_bench.ts --batches "$BATCHES" --steps 48 || status=1
else
  echo "(no $MODEL_MIRROR/stories260K.bin: skipping the stories260K benchmark; set MODEL_MIRROR)"
fi
step "matmul GB/s by tensor type (K-quants against F16), Llama-1B ffn_up shape"
timeout 120 $DENO run --allow-all bench/matmul_formats_bench.ts --rows 8192 --cols 2048 --repeat 50 || status=1
for type in f16 q4_0; do
  step "Llama-3.2-1B shape, $type"
  timeout 120 $DENO run --allow-all --v8-flags=--max-old-space-size=8192 bench/kernels_bench.ts \
    --synthetic "$type" --batches "$BATCHES" --steps 24 --prompt 64 || status=1
done
exit $status
