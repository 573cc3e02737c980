"""Writes a copy of csrc/comm/all_gather_hidden.cuh with clock64() stamps in the pipelined flag
kernel (CTA 0 only), for bench/lab/tools/ag_micro.cu built with -DTS_PIPE_TRACE (a diagnostic; the library
never ships it).

    python3 bench/lab/tools/ag_pipe_trace_patch.py /tmp/pt && \
        nvcc -std=c++17 -O3 -arch=sm_90a -DTS_PIPE_TRACE -I/tmp/pt -o ag_pt bench/lab/tools/ag_micro.cu

Per call (slot epoch % 64) and round k < 16, cycles since the kernel passed griddepcontrol.wait:
[0] data warp 1 has issued its stores of round k, [1] the signalling warp's peer lane starts
the release of round k's flag, [2] the release returned (its fence is done), [3] the peer's
round-k flag was seen, [4] data warp 1 passed the barrier that hands it round k for copy-out,
[5] it finished copying round k out. ag_micro prints the means over the last 64 calls.
"""
from ag_trace_patch import find, write_patched  # same folder: on sys.path when run as a script

REC = ("if (blockIdx.x == 0 && {cond} && ({k}) < 16u) "
       "g_ptrace[epoch % 64][{k}][{j}] = clock64() - tp0;")
ins, before = {}, {}
ins[find("namespace tokenspeed_kernel::comm {")] = [
    "__device__ long long g_ptrace[64][16][6];"]
k0 = find("all_gather_hidden_pipe_kernel(const")
ins[find("detail::pdl_enter();", k0)] = ["  const long long tp0 = clock64();"]
peer_lane = "lane == (p.rank ^ 1)"
rel = find("if (peer && k < my_rounds)", k0)
before[rel] = ["      " + REC.format(cond=peer_lane, k="k", j=1)]
ins[rel + 1] = ["      " + REC.format(cond=peer_lane, k="k", j=2)]
sw = find("__syncwarp();", rel)
before[sw] = ["      " + REC.format(cond=peer_lane, k="k", j=3)]
arr = find("detail::bar_arrive(1 + (k & 1), kAgThreads);", sw)
before[arr] = ["    " + REC.format(cond="dt == 0", k="k", j=0)]
bs = find("detail::bar_sync(3 + ((k - 1) & 1), kAgThreads);", arr)
ins[bs] = ["      " + REC.format(cond="dt == 0", k="k - 1", j=4)]
ins[bs + 1] = ["      " + REC.format(cond="dt == 0", k="k - 1", j=5)]
bs = find("detail::bar_sync(3 + ((nrounds - 1) & 1), kAgThreads);", bs)
ins[bs] = ["    " + REC.format(cond="dt == 0", k="nrounds - 1", j=4)]
ins[bs + 1] = ["    " + REC.format(cond="dt == 0", k="nrounds - 1", j=5)]
write_patched(ins, before, "/tmp/pt")
