"""Writes a copy of csrc/comm/all_gather_hidden.cuh with clock64() phase stamps in the two LL
kernels, for bench/lab/tools/ag_micro.cu built with -DTS_AG_TRACE (a diagnostic; the library never ships it).

    python3 bench/lab/tools/ag_trace_patch.py /tmp/tr && \
        nvcc -std=c++17 -O3 -arch=sm_90a -DTS_AG_TRACE -I/tmp/tr -o ag_trace bench/lab/tools/ag_micro.cu

Per call (slot epoch % 64) and CTA: [0] entry -> after griddepcontrol.wait, [1] -> after the push
loop (the x loads have returned and the LL stores are issued), [2] -> after the receive loop,
[3] the slowest thread's wait-to-end. ag_micro prints CTA 0's mean and the mean of the max over
CTAs, in ns at the SM's nominal clock.
"""
import sys
from pathlib import Path

HEADER = Path(__file__).resolve().parents[3] / "csrc/comm/all_gather_hidden.cuh"
lines = HEADER.read_text().split("\n")


def find(s, start=0):
    """Index of the first line from `start` on that contains `s` (exits if there is none)."""
    for i in range(start, len(lines)):
        if s in lines[i]:
            return i
    raise SystemExit(f"marker not found: {s!r}")


def write_patched(ins, before, default_dst):
    """Writes the header with before[i] inserted above and ins[i] below line i into the folder
    argv[1] (else default_dst) and prints the path."""
    out = []
    for i, line in enumerate(lines):
        out.extend(before.get(i, []))
        out.append(line)
        out.extend(ins.get(i, []))
    dst = Path(sys.argv[1] if len(sys.argv) > 1 else default_dst)
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "all_gather_hidden.cuh").write_text("\n".join(out))
    print(dst / "all_gather_hidden.cuh")


def main():
    ins = {find("namespace tokenspeed_kernel::comm {"):
           ["__device__ long long g_trace[64][256][4];"]}
    for kname in ("all_gather_hidden_ll_kernel(", "all_gather_hidden_ll4_kernel("):
        k = find(kname)
        pe = find("detail::pdl_enter();", k)
        adv = find("if (tid == 0) detail::advance_seq(p, epoch);", k)
        e = find("bool ok = true;", adv)
        while lines[e] != "}":
            e += 1
        ins[find("const int b = blockIdx.x;", k)] = [
            "  long long tc0 = clock64(); __shared__ unsigned long long s_tmax;"
            " if (threadIdx.x == 0) s_tmax = 0;"]
        ins[pe] = ["  long long tc1 = clock64();"]
        ins.setdefault(adv - 1, []).append("  long long tc2 = clock64();")
        ins.setdefault(e - 1, []).extend([
            "  { long long tc3 = clock64(); atomicMax(&s_tmax, (unsigned long long)(tc3 - tc1));"
            " __syncthreads();",
            "    if (threadIdx.x == 0) { long long* g = g_trace[epoch % 64][blockIdx.x];"
            " g[0] = tc1 - tc0; g[1] = tc2 - tc1; g[2] = tc3 - tc2; g[3] = (long long)s_tmax; } }"])
    write_patched(ins, {}, "/tmp/tr")


if __name__ == "__main__":
    main()
