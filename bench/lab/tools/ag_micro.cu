// Standalone micro-benchmark of the all-gather push kernels on 2 GPUs of one host (one process,
// P2P over cudaMalloc + peer access instead of torch symmetric memory; no multicast). It exists to
// A/B kernel variants quickly: it includes csrc/comm/all_gather_hidden.cuh (or any copy of it,
// via -I), compiles in seconds, and times the same thing the bench does -- CUDA-graph replay of N
// back-to-back calls per GPU, max over the two GPUs -- after checking one call bit-exact against
// the host's expected output. Not part of the library or the test suite.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -Icsrc/comm -o ag_micro bench/lab/tools/ag_micro.cu
//   ./ag_micro <mode> <elt bytes> <H> <T,T,...> [pdl 0|1] [block_bytes 4096] [calls 256] [reps 7]
//     mode: ll (6-byte packets), ll4, flag, or a number (raw kAgFlag* bits)
// Prints one line per T: "mode elt H T blocks us_per_call(median) min max ok". Built with
// -DTS_AG_TRACE against the header copy of bench/lab/tools/ag_trace_patch.py it also prints the LL kernels'
// phase durations (bench/lab/h200/comm_micro_trace_s23.csv); built with -DTS_PIPE_TRACE
// against that of bench/lab/tools/ag_pipe_trace_patch.py, the pipelined flag kernel's per-round stamps.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "all_gather_hidden.cuh"
#include "graph_timing.cuh"

using namespace tokenspeed_kernel::comm;

static std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  std::string t(s);
  size_t a = 0;
  while (a < t.size()) {
    size_t b = t.find(',', a);
    if (b == std::string::npos) b = t.size();
    v.push_back(atoi(t.substr(a, b - a).c_str()));
    a = b + 1;
  }
  return v;
}

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr,
            "usage: %s <ll|ll4|flag|bits> <elt> <H> <T,...> [pdl] [block_bytes] [calls] [reps]\n",
            argv[0]);
    return 1;
  }
  const std::string mode = argv[1];
  const int elt = atoi(argv[2]);
  const int H = atoi(argv[3]);
  const std::vector<int> Ts = parse_list(argv[4]);
  const int pdl = argc > 5 ? atoi(argv[5]) : 1;
  const int block_bytes = argc > 6 ? atoi(argv[6]) : 4096;
  const int calls = argc > 7 ? atoi(argv[7]) : 256;
  const int reps = argc > 8 ? atoi(argv[8]) : 7;
  int flags = 0;
  if (mode == "ll")
    flags = kAgFlagLL;
  else if (mode == "ll4")
    flags = kAgFlagLL | kAgFlagLL4;
  else if (mode == "flag")
    flags = 0;
  else
    flags = atoi(mode.c_str());
  if (pdl) flags |= kAgFlagPDL;
  constexpr int W = 2;
  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  if (ndev < W) {
    fprintf(stderr, "need 2 GPUs\n");
    return 1;
  }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int maxT = *std::max_element(Ts.begin(), Ts.end());
  const int64_t row_bytes = int64_t(H) * elt;
  if (row_bytes % (16 * W)) {
    fprintf(stderr, "H * elt must be a multiple of %d\n", 16 * W);
    return 1;
  }
  const int row_vec = int(row_bytes / 16);
  const int wv = row_vec / W;
  const int64_t buf_bytes = int64_t(maxT) * row_bytes;
  const int64_t ll_bytes = (ll_region_bytes(int64_t(maxT) * row_vec, W) + 255) / 256 * 256;
  const int64_t data_bytes = 2 * buf_bytes + 2 * ll_bytes;
  const int nout = 4;
  uint8_t *data[W], *x[W], *out[W][nout];
  uint64_t* fl[W];
  int64_t* state[W];
  cudaStream_t st[W];
  std::vector<uint8_t> hx[W];
  for (int d = 0; d < W; ++d) {
    CK(cudaSetDevice(d));
    for (int e = 0; e < W; ++e)
      if (e != d) {
        cudaError_t r = cudaDeviceEnablePeerAccess(e, 0);
        if (r != cudaSuccess && r != cudaErrorPeerAccessAlreadyEnabled) CK(r);
      }
    CK(cudaMalloc(&data[d], data_bytes));
    CK(cudaMemset(data[d], 0, data_bytes));
    CK(cudaMalloc(&fl[d], kAgFlagBytes));
    CK(cudaMemset(fl[d], 0, kAgFlagBytes));
    CK(cudaMalloc(&state[d], kAgStateWords * 8));
    CK(cudaMemset(state[d], 0, kAgStateWords * 8));
    CK(cudaMalloc(&x[d], int64_t(maxT) * wv * 16));
    for (int o = 0; o < nout; ++o) CK(cudaMalloc(&out[d][o], buf_bytes));
    hx[d].resize(size_t(maxT) * wv * 16);
    uint32_t s = 12345u + 977u * d;
    for (auto& b : hx[d]) {
      s = s * 1664525u + 1013904223u;
      b = uint8_t(s >> 24);
    }
    CK(cudaMemcpy(x[d], hx[d].data(), hx[d].size(), cudaMemcpyHostToDevice));
    CK(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
  }
  auto params = [&](int d, int T, int o) {
    AllGatherHiddenParams p{};
    p.x = x[d];
    p.ldx = int64_t(wv) * 16;
    p.out = out[d][o];
    p.ldo = row_bytes;
    for (int q = 0; q < W; ++q) {
      p.peer_data[q] = data[q];
      p.peer_flags[q] = fl[q];
    }
    p.my_data = data[d];
    p.my_flags = fl[d];
    p.state = state[d];
    p.buf_bytes = buf_bytes;
    for (int q = 0; q <= W; ++q) p.col_vec[q] = q * wv;
    p.rows = T;
    p.row_vec = row_vec;
    p.world = W;
    p.rank = d;
    const int64_t slice = int64_t(T) * wv * 16;
    const int64_t want = (slice + block_bytes - 1) / block_bytes;
    p.num_blocks = int(std::max<int64_t>(1, std::min<int64_t>(std::min(sms, kAgMaxBlocks), want)));
    p.flags = flags;
    p.timeout_ns = 5000000000LL;
    p.ll_off = 2 * buf_bytes;
    p.ll_bytes = ll_bytes;
    return p;
  };
  for (int T : Ts) {
    // one call, checked
    for (int d = 0; d < W; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaMemsetAsync(out[d][0], 0xEE, buf_bytes, st[d]));
      CK(launch_all_gather_hidden(params(d, T, 0), st[d]));
    }
    bool ok = true;
    for (int d = 0; d < W; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaStreamSynchronize(st[d]));
      std::vector<uint8_t> h(size_t(T) * row_bytes);
      CK(cudaMemcpy(h.data(), out[d][0], h.size(), cudaMemcpyDeviceToHost));
      for (int t = 0; t < T && ok; ++t)
        for (int q = 0; q < W && ok; ++q)
          ok = memcmp(h.data() + t * row_bytes + int64_t(q) * wv * 16,
                      hx[q].data() + int64_t(t) * wv * 16, size_t(wv) * 16) == 0;
      int64_t err = 0;
      CK(cudaMemcpy(&err, state[d] + kAgStateErr, 8, cudaMemcpyDeviceToHost));
      if (err) ok = false;
    }
    // graphs of `calls` back-to-back calls per GPU
    cudaGraphExec_t ge[W];
    for (int d = 0; d < W; ++d) {
      CK(cudaSetDevice(d));
      ge[d] = capture_calls(st[d], calls, [&](int c) {
        CK(launch_all_gather_hidden(params(d, T, c % nout), st[d]));
      });
    }
    const std::vector<double> us = replay_us(ge, st, W, calls, reps);
    for (int d = 0; d < W; ++d) {
      CK(cudaSetDevice(d));
      int64_t err = 0;
      CK(cudaMemcpy(&err, state[d] + kAgStateErr, 8, cudaMemcpyDeviceToHost));
      if (err) ok = false;
    }
#ifdef TS_AG_TRACE
    {  // per-CTA phase durations of the last 64 calls (clock64 of CTA 0 and of the slowest CTA)
      int khz = 0;
      CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
      for (int d = 0; d < W; ++d) {
        CK(cudaSetDevice(d));
        static long long tr[64][256][4];
        CK(cudaMemcpyFromSymbol(tr, g_trace, sizeof(tr)));
        const int nb = params(d, T, 0).num_blocks;
        double a[4] = {0, 0, 0, 0}, mx[4] = {0, 0, 0, 0};
        for (int e = 0; e < 64; ++e)
          for (int k = 0; k < 4; ++k) {
            a[k] += tr[e][0][k] / 64.0;
            double m = 0;
            for (int b = 0; b < nb; ++b) m = std::max(m, double(tr[e][b][k]));
            mx[k] += m / 64.0;
          }
        const double ns = 1e6 / khz;
        printf("  trace dev%d (ns, CTA0 | max CTA): pdl-wait %.0f|%.0f  load+push %.0f|%.0f  "
               "recv %.0f|%.0f  slowest-thread %.0f|%.0f\n",
               d, a[0] * ns, mx[0] * ns, a[1] * ns, mx[1] * ns, a[2] * ns, mx[2] * ns,
               a[3] * ns, mx[3] * ns);
      }
    }
#endif
#ifdef TS_PIPE_TRACE
    {  // the pipelined flag kernel's per-round stamps of CTA 0 (bench/lab/tools/ag_pipe_trace_patch.py)
      int khz = 0;
      CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
      const double ns = 1e6 / khz;
      for (int d = 0; d < W; ++d) {
        CK(cudaSetDevice(d));
        static long long tr[64][16][6];
        CK(cudaMemcpyFromSymbol(tr, g_ptrace, sizeof(tr)));
        printf("  pipe trace dev%d, CTA 0, ns after the wait: round: pushed | release start -> "
               "done | flag seen | copy-out start -> done\n", d);
        for (int k = 0; k < 16; ++k) {
          double a[6] = {0, 0, 0, 0, 0, 0};
          for (int e = 0; e < 64; ++e)
            for (int j = 0; j < 6; ++j) a[j] += tr[e][k][j] / 64.0;
          if (a[0] == 0 && a[4] == 0) break;
          printf("    %2d: %8.0f | %8.0f -> %8.0f | %8.0f | %8.0f -> %8.0f\n", k, a[0] * ns,
                 a[1] * ns, a[2] * ns, a[3] * ns, a[4] * ns, a[5] * ns);
        }
        static const long long zero[64][16][6] = {};
        CK(cudaMemcpyToSymbol(g_ptrace, zero, sizeof(zero)));  // the next T starts clean
      }
    }
#endif
    printf("%s elt=%d H=%d T=%d pdl=%d blocks=%d us=%.3f min=%.3f max=%.3f %s\n", mode.c_str(), elt,
           H, T, pdl, params(0, T, 0).num_blocks, us[us.size() / 2], us.front(), us.back(),
           ok ? "ok" : "MISMATCH");
    fflush(stdout);
  }
  return 0;
}
