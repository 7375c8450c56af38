/**
 * Minimal reproduction: `deno test` with WebGPU on OpenGL ES (Mesa llvmpipe) sometimes aborts
 * or crashes at exit after the test passed, on Deno 2.9.6 and Debian 12 x86-64:
 *
 *   for i in $(seq 80); do DENO_WEBGPU_BACKEND=gl npx -y deno@2.9.6 test -A --no-config \
 *     bench/repro/gl_exit_race_test.ts >/dev/null 2>&1 || echo "run $i: exit $?"; done
 *
 * gave 2 of 80 runs with exit 134 or 139 ("double free or corruption", SIGSEGV in free), and
 * 0 of 80 with `--preload .ci/exit_without_destructors.ts`, which explains the cause. The same
 * happens more often in tests/webgpu_engine_test.ts (its module thread has done more).
 */
Deno.test("one compute dispatch on the default adapter, read back", async () => {
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) throw new Error("no WebGPU adapter");
  const device = await adapter.requestDevice();
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC;
  const buf = device.createBuffer({ size: 1024, usage });
  const module = device.createShaderModule({
    code: `@group(0) @binding(0) var<storage, read_write> a: array<u32>;
      @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) i: vec3u) {
        a[i.x] = i.x * 3u;
      }`,
  });
  const pipeline = device.createComputePipeline({
    layout: "auto",
    compute: { module, entryPoint: "main" },
  });
  const read = device.createBuffer({
    size: 1024,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(pipeline);
  pass.setBindGroup(
    0,
    device.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: [{ binding: 0, resource: { buffer: buf } }],
    }),
  );
  pass.dispatchWorkgroups(4);
  pass.end();
  enc.copyBufferToBuffer(buf, 0, read, 0, 1024);
  device.queue.submit([enc.finish()]);
  await read.mapAsync(GPUMapMode.READ);
  const got = new Uint32Array(read.getMappedRange())[5];
  read.unmap();
  if (got !== 15) throw new Error(`a[5] is ${got}, expected 15`);
});
