/**
 * Preloaded into every `deno test` run (`.ci/test.ts`): the process ends through `_exit`, so
 * shared libraries' destructors do not run at exit.
 *
 * Why: with WebGPU on OpenGL ES (Mesa llvmpipe, so LLVM and its libxml2 and libedit are
 * loaded), `deno test` aborted at exit in about 1 run in 10 ("corrupted size vs. prev_size in
 * fastbins", "double free or corruption", or SIGSEGV, exit 134/139), after every test had
 * passed. Core dumps show the same two threads each time: the main thread in `exit()` →
 * `_dl_fini`, running a library's destructor (libxml2's, libedit's), while the thread that ran
 * the test module, the one that drove the GL device, is still exiting and frees its
 * thread-local state and malloc cache into memory those destructors already freed. Deno's test
 * runner does not wait for that thread before it exits, and nothing in a test can make it.
 * `deno run` (the server) runs WebGPU on the main thread and is not affected. The reproduction
 * is `bench/repro/gl_exit_race_test.ts`.
 *
 * `on_exit` handlers run before `_dl_fini` and receive the exit status, which is also
 * `_exit`'s only argument: registering `_exit` itself keeps the runner's exit code (1 when a
 * test failed) and skips only the destructors. The runner has written its report by then, and
 * Deno's stdout is not buffered in libc, so nothing printed is lost.
 */
const KEY = "LLMSERVE_EXIT_WITHOUT_DESTRUCTORS";

// Each test module preloads this file; one registration per process is enough.
if (Deno.build.os === "linux" && Deno.env.get(KEY) !== String(Deno.pid)) {
  const libc = Deno.dlopen("libc.so.6", {
    dlsym: { parameters: ["pointer", "buffer"], result: "pointer" },
    on_exit: { parameters: ["pointer", "pointer"], result: "i32" },
  });
  // RTLD_DEFAULT is the null handle on glibc.
  const exitNow = libc.symbols.dlsym(null, new TextEncoder().encode("_exit\0"));
  if (exitNow === null) throw new Error("exit_without_destructors: libc has no _exit");
  const rc = libc.symbols.on_exit(exitNow, null);
  if (rc !== 0) throw new Error(`exit_without_destructors: on_exit returned ${rc}`);
  Deno.env.set(KEY, String(Deno.pid));
}
