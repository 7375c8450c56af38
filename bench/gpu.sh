#!/usr/bin/env bash
# The WebGPU engine on a lent GPU, in one go (under 8 minutes), printing markdown:
#   1. the adapter (info, features, limits);
#   2. the greedy fixtures and kernel tests on the device: WebGpuEngine against CpuEngine and
#      against llama.cpp's outputs (stories260K and its carriers, tinyllama-like Q4_K_M/Q5_K_M);
#   3. matmul weight GB/s per tensor type at Llama-3.2-1B shapes (ffn_up 8192×2048 and the
#      classifier 128256×2048), as a share of the device's memory bandwidth;
#   4. decode tokens/s at 1, 8 and 32 sequences on the two real-proportioned shapes
#      (Qwen2.5-0.5B and Llama-3.2-1B, each tensor in its Q4_K_M file's encoding, random
#      weights built in memory: the 400-800 MB files cannot be carried to the device).
#
# On a bare machine, pack first here (bash bench/gpu_pack.sh) and carry .gpu/: it holds a
# compressed deno, a DENO_DIR with the one npm package the tests import (and a deno.json that
# maps just it), and the model files.
# Without .gpu/, it uses deno from PATH (or npx) and MODEL_MIRROR (default ../shared/models).
#   bench/gpu.sh                  # BANDWIDTH_GBS=4800 to set the bandwidth the shares assume
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ -f .gpu/deno.xz ]]; then
  DENO="${TMPDIR:-/tmp}/llmserve-gpu-deno"
  if [[ ! -x "$DENO" ]]; then
    { xz -dc .gpu/deno.xz 2>/dev/null ||
      python3 -c 'import lzma,sys; sys.stdout.buffer.write(lzma.open(".gpu/deno.xz").read())'; } > "$DENO.part" &&
      chmod +x "$DENO.part" && mv "$DENO.part" "$DENO" || { echo "gpu.sh: cannot unpack .gpu/deno.xz" >&2; exit 1; }
  fi
  export DENO_DIR="$PWD/.gpu/deno_dir" MODEL_MIRROR="$PWD/.gpu/models" DENO_NO_UPDATE_CHECK=1
  CACHED="--cached-only --config .gpu/deno.json"
else
  if [[ -n "${DENO:-}" ]]; then :; elif command -v deno >/dev/null; then DENO=deno; else DENO="npx -y deno@2.9.6"; fi
  export MODEL_MIRROR="${MODEL_MIRROR:-../shared/models}"
  CACHED=
fi
status=0
step() { echo; echo "### $1"; echo; }
bw=()
[[ -n "${BANDWIDTH_GBS:-}" ]] && bw=(--bandwidth-gbs "$BANDWIDTH_GBS")

step "adapter"
timeout 30 $DENO run $CACHED --allow-all bench/adapter_info.ts || status=1

step "greedy fixtures and kernel tests on the device"
timeout 240 $DENO test $CACHED --allow-all tests/matmul_test.ts tests/kernels_test.ts tests/attention_test.ts \
  tests/sample_test.ts tests/webgpu_engine_test.ts 2>&1 | grep -E "^(ok|FAILED)|passed|failed|error" || status=1
timeout 120 $DENO test $CACHED --allow-all tests/compat_llama_cpp_webgpu_test.ts \
  --filter "/^(stories260K|tinyllama-like-q4_k_m |tinyllama-like-q5_k_m )/" 2>&1 |
  grep -E "^(ok|FAILED)|passed|failed|error" || status=1

step "matmul GB/s by tensor type, Llama-3.2-1B ffn_up [8192, 2048]"
timeout 90 $DENO run $CACHED --allow-all bench/matmul_formats_bench.ts --rows 8192 --cols 2048 --repeat 50 "${bw[@]}" || status=1
step "matmul GB/s by tensor type, Llama-3.2-1B classifier [128256, 2048]"
timeout 120 $DENO run $CACHED --allow-all --v8-flags=--max-old-space-size=16384 bench/matmul_formats_bench.ts \
  --rows 128256 --cols 2048 --repeat 5 "${bw[@]}" || status=1

for shape in qwen25_05b llama32_1b; do
  step "decode, $shape shape (Q4_K_M encodings, random weights)"
  timeout 120 $DENO run $CACHED --allow-all --v8-flags=--max-old-space-size=8192 bench/kernels_bench.ts \
    --shape "$shape" --batches 1,8,32 --steps 24 --prompt 64 || status=1
done
exit $status
