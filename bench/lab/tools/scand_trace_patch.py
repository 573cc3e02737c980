"""Adds phase stamps to the CUDA sampler's split-candidates launch (a diagnostic build; the
library never ships it): clock64() stamps in CTA 0's phase 1 and in row 0's finishing CTA, the
span from the first CTA's start to the last arrival (%globaltimer), the finisher's forwarded-key
count and the number of chunks it read again. The op prints them to stderr every Nth call when
TS_LAB_PROF=N is set (N < 1: every 10th; it synchronizes: eager calls only, e.g. with
prof_sampling.py's PROF_ONCE=1).

    python3 bench/lab/tools/scand_trace_patch.py [DIR]
        writes patched copies of csrc/sampling/sampler.cuh and sampling_ops.cu into DIR/sampling
        (default: in place, for a throw-away tree such as the GPU machine's copy), then
    pip install --no-build-isolation --no-deps -e . && \\
    TS_LAB_PROF=1 python3 bench/lab/tools/prof_sampling.py cuda,top_k,1,151936,fp32

Output: "LAB arrive_ns=<first start -> last arrival> fin_clk merge=.. preU=.. sel=.. cand=..
finish=.. (cycles from the finisher's start) noff=<chunks read again> nU=<forwarded keys>
p1_clk load=.. th=.. arrive=.. (cycles from CTA 0's start) stats exact_plain=.. generic=..
reread=.. band_exact=..": the kernels' p.stats counters of the call, every row and launch (the
cluster kernel's too): exact passes of temperature-only rows, rows on a generic path (one CTA's,
or deferred), chunks read again, band masses that needed the exact mass". Calls on the cluster
launch add "LABCL clk head=.. p1=.. wait=.. sel=.. B1=.. merged=.. mass=.. rsel=.. fin0=..
fin1=..": cycles from the start of CTA 0 (rank 0 of row 0) to the end of the head's select, of
pass 1, the wait for the peers, the CTA's candidate select, the summary barrier, the row merge,
the total mass, rank 0's select, and before / after `cand_finish`. Calls whose top-p rows take
the HIST finish add "LABHIST clk p2=.. hsync=.. dsync=.. p3=.. fsync=.. end=.. n=.. bstar=..":
cycles from the start of `hist_topp` in CTA 0 to the end of level 0's histogram pass (and its
sum), the
cluster barrier after the histograms' push, the decision barrier (the last level's), the end of
the scoring pass, the last barrier and before rank 0's `write_row`, with the boundary bin's
token count and its index.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "csrc/sampling"

KERNEL = [  # (anchor, text inserted after the anchor's line, or before with a leading "<")
    ("  unsigned int* stats;",
     "  unsigned long long* lab;  // LAB-PROF"),
    ("  unsigned long long* fkeys = reinterpret_cast<unsigned long long*>(sums + int64_t(p.rows) * S);",
     "  auto gt = []() { unsigned long long t; asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t)); return t; };\n"
     "  const bool labc = p.lab && blockIdx.x == 0 && threadIdx.x == 0;\n"
     "  long long lc0 = clock64();\n"
     "  if (p.lab && threadIdx.x == 0) atomicMin(&p.lab[0], gt());"),
    ("  // the CTA's summary: warp merges, then warp 0", "<  if (labc) p.lab[8] = clock64() - lc0;"),
    ("    th = s.bcast[0];", "<    if (labc) p.lab[9] = clock64() - lc0;"),
    ("      const unsigned old = atomicAdd(&ctr[row], 1u);",
     "<      if (labc) p.lab[10] = clock64() - lc0;\n      if (p.lab) atomicMax(&p.lab[1], gt());"),
    ("  // ---------------- finish: the row's last CTA ----------------",
     "  const long long lf0 = clock64();\n  const bool labf = p.lab && row == 0 && tid == 0;"),
    ("  const bool ok = (kProc ? !(rbad & 1u) : !rbad) && zmax > -INFINITY;",
     "<  if (labf) p.lab[2] = clock64() - lf0;"),
    ("    const unsigned long long t = block_select<RU>(keys, r.K, s, &nU);",
     "<    if (labf) p.lab[3] = clock64() - lf0;"),
    ("    const int noff = __syncthreads_count(", "<    if (labf) p.lab[4] = clock64() - lf0;"),
    ("      unsigned long long S_row = 0, S_hi = 0;",
     "<    if (labf) { p.lab[5] = clock64() - lf0; p.lab[7] = noff; p.lab[11] = nU; }"),
    ("      if (tok == -2) {  // a prefix mass within the band",
     "<      if (labf) p.lab[6] = clock64() - lf0;"),
]
CLUSTER = [  # stamps in the cluster kernel (sample_kernel), CTA 0 of row 0, lab[16..25]
    ("  const int row = row0;",
     "  const long long lk0 = clock64();\n  const bool labk = p.lab && blockIdx.x == 0 && threadIdx.x == 0;"),
    ("    if (nvalid < r.K) th0 = 0;", "  if (labk) p.lab[16] = clock64() - lk0;"),
    ("  // ---------------- CTA summary ----------------", "<  if (labk) p.lab[17] = clock64() - lk0;"),
    ("  if (cs > 1) cg::this_cluster().barrier_wait();", "<  if (labk) p.lab[18] = clock64() - lk0;"),
    ("    mine.ovf = nb > unsigned(kCandBuf) ? 1u : 0u;", "<    if (labk) p.lab[19] = clock64() - lk0;"),
    ("  cluster_sync(cs);  // B1", "<  if (labk) p.lab[20] = clock64() - lk0;"),
    ("  // ---------------- row summary", "<  if (labk) p.lab[21] = clock64() - lk0;"),
    ("    int need_generic = 0;", "<    if (labk) p.lab[22] = clock64() - lk0;"),
    ("        const unsigned long long t = block_select<RR>(keys, r.K, s);",
     "        if (labk) p.lab[23] = clock64() - lk0;"),
    ("      const int tok = cand_finish(r, s, fin, n, p.vocab, zmax, S_row, lp, ps, ytok);",
     "<      if (labk) p.lab[24] = clock64() - lk0;"),
    ("      if (tok < 0) {", "<      if (labk) p.lab[25] = clock64() - lk0;"),
]
HIST = [  # stamps in hist_topp (the HIST finish), CTA 0 (rank 0 of row 0), lab[26..31], lab[25]
    ("  unsigned long long code = kHistGeneric;",
     "  const long long lh0 = clock64();\n  const bool labh = p.lab && blockIdx.x == 0 && threadIdx.x == 0;"),
    ("      slot[tid] = s.hmass[tid];", "<      if (labh && level == 0) p.lab[26] = clock64() - lh0;"),
    (("        S = block_sum_u64(tid < cs ? cbuf[tid * kCbufPerCta + kHistSlotS] : 0ull, s);",
      "        S = accs;"),   # (the second: with the s18 lab patches)
     "<        if (labh) p.lab[27] = clock64() - lh0;"),
    ("    code = s.bcast[4];", "<    if (labh) p.lab[28] = clock64() - lh0;"),
    (("    *peer(&s.best[rank], 0) = best;", "    *at0(&s.best[rank]) = best;"),
     "<    if (labh) p.lab[29] = clock64() - lh0;"),
    ("  const int n = push ? min(int(s.counter), cap) : 0;", "<  if (labh) p.lab[30] = clock64() - lh0;"),
    ("    write_row(p, row, tok, true, raw_lp(tok), plp);",
     "<    if (labh) {\n      p.lab[31] = clock64() - lh0;\n"
     "      p.lab[25] = ((unsigned long long)n << 20) | unsigned(bstar);\n    }"),
]
OPS = [
    ("  cudaError_t err = cudaSuccess;",
     "  static unsigned long long* labbuf = nullptr;\n"
     "  static const bool labon = getenv(\"TS_LAB_PROF\") != nullptr;\n"
     "  if (labon) {\n"
     "    if (!labbuf) cudaMalloc(&labbuf, 32 * 8);\n"
     "    cudaMemsetAsync(labbuf, 0, 32 * 8, stream);\n"
     "    cudaMemsetAsync(labbuf, 0xff, 8, stream);\n"
     "    p.lab = labbuf;\n"
     "    p.stats = reinterpret_cast<unsigned int*>(labbuf + 12);\n"
     "  }"),
    ("  TS_CHECK(err == cudaSuccess, \"tokenspeed_kernel.sample: CUDA error: \", cudaGetErrorString(err));",
     "  if (labon) {\n"
     "    static int calls = 0;\n"
     "    unsigned long long h[32];\n"
     "    cudaStreamSynchronize(stream);\n"
     "    cudaMemcpy(h, labbuf, sizeof(h), cudaMemcpyDeviceToHost);\n"
     "    static const int every = atoi(getenv(\"TS_LAB_PROF\")) > 0 ? atoi(getenv(\"TS_LAB_PROF\")) : 10;\n"
     "    if (++calls % every == 0)\n"
     "      fprintf(stderr, \"LAB arrive_ns=%llu fin_clk merge=%llu preU=%llu sel=%llu cand=%llu \"\n"
     "              \"finish=%llu noff=%llu nU=%llu p1_clk load=%llu th=%llu arrive=%llu \"\n"
     "              \"stats exact_plain=%u generic=%u reread=%u band_exact=%u\\n\",\n"
     "              h[1] - h[0], h[2], h[3], h[4], h[5], h[6], h[7], h[11], h[8], h[9], h[10],\n"
     "              unsigned(h[12]), unsigned(h[12] >> 32), unsigned(h[13]), unsigned(h[13] >> 32));\n"
     "    if (calls % every == 0 && h[17])\n"
     "      fprintf(stderr, \"LABCL clk head=%llu p1=%llu wait=%llu sel=%llu B1=%llu merged=%llu \"\n"
     "              \"mass=%llu rsel=%llu fin0=%llu fin1=%llu\\n\", h[16], h[17], h[18], h[19], h[20],\n"
     "              h[21], h[22], h[23], h[24], h[25]);\n"
     "    if (calls % every == 0 && h[27])\n"
     "      fprintf(stderr, \"LABHIST clk (from the HIST start; row summary merged=%llu from the \"\n"
     "              \"kernel start) p2=%llu hsync=%llu dsync=%llu p3=%llu fsync=%llu end=%llu \"\n"
     "              \"n=%llu bstar=%llu\\n\", h[21], h[26], h[27], h[28], h[29], h[30], h[31],\n"
     "              h[25] >> 20, h[25] & 0xfffff);\n"
     "  }"),
]


def patch(text, edits, name, kernel="scand_kernel"):
    """Inserts each edit's text after (or, text starting with "<", before) the line holding its
    anchor; an anchor may be a tuple of alternatives (the first one found is used: the tree with
    or without the lab patches of bench/lab/patches)."""
    lines = text.split("\n")
    for anchor, ins in edits:
        if isinstance(anchor, tuple):
            anchor = next((a for a in anchor if any(a in l for l in lines)), anchor[0])
        hits = [i for i, l in enumerate(lines) if anchor in l]
        if len(hits) > 1:  # the first one inside the kernel
            k0 = [i for i, l in enumerate(lines) if f"{kernel}(const Params p)" in l]
            hits = [i for i in hits if k0 and i > k0[0]][:1]
        if len(hits) != 1:
            raise SystemExit(f"{name}: marker found {len(hits)} times (want 1): {anchor!r}")
        i = hits[0]
        if ins.startswith("<"):
            lines[i:i] = ins[1:].split("\n")
        else:
            lines[i + 1:i + 1] = ins.split("\n")
    return "\n".join(lines)


def main():
    dst = Path(sys.argv[1]) / "sampling" if len(sys.argv) > 1 else SRC
    dst.mkdir(parents=True, exist_ok=True)
    for fname, edits in (("sampler.cuh", KERNEL), ("sampling_ops.cu", OPS)):
        out = patch((SRC / fname).read_text(), edits, fname)
        if fname == "sampler.cuh":
            out = patch(out, CLUSTER, fname, "sample_kernel")
            out = patch(out, HIST, fname, "sample_kernel")
        (dst / fname).write_text(out)
        print(dst / fname)


if __name__ == "__main__":
    main()
