/** What a benchmark ran on, for its report. */
export interface MachineInfo {
  readonly cpu: string;
  readonly cores: number;
  readonly memoryGiB: number;
  readonly os: string;
  readonly deno: string;
  /** 1-minute load average at the start (the machine may be shared). */
  readonly loadAverage: number;
}

export function machineInfo(): MachineInfo {
  let cpu = "unknown";
  try {
    cpu = /model name\s*:\s*(.+)/.exec(Deno.readTextFileSync("/proc/cpuinfo"))?.[1]?.trim() ?? cpu;
  } catch { /* not Linux */ }
  let memoryGiB = NaN, loadAverage = NaN;
  try {
    memoryGiB = Deno.systemMemoryInfo().total / 2 ** 30;
    loadAverage = Deno.loadavg()[0] ?? NaN;
  } catch { /* needs --allow-sys */ }
  return {
    cpu,
    cores: navigator.hardwareConcurrency,
    memoryGiB: Math.round(memoryGiB * 10) / 10,
    os: `${Deno.build.os} ${Deno.osRelease()}`,
    deno: Deno.version.deno,
    loadAverage: Math.round(loadAverage * 100) / 100,
  };
}

/** One line: "2 × Intel Xeon ..., 7.8 GiB, linux 6.1, Deno 2.9.6, load 1.2". */
export function machineLine(m: MachineInfo): string {
  return `${m.cores} × ${m.cpu}, ${m.memoryGiB} GiB, ${m.os}, Deno ${m.deno}, load average ${m.loadAverage} at start`;
}
