// What can cross NVLink between 2 GPUs of one host, with no protocol at all: the ceiling against
// which the flag protocol's share of the floor is judged (docs/COMM.md, "What bounds the vocab
// row"). One process, cudaMalloc + peer access, no multicast. Every mode moves each GPU's slice
// `x[T, w]` (w = row bytes / 2) into the other GPU's `[T, 2w]` buffer at its column offset, the
// all-gather's layout, both GPUs at once (bidirectional, like the all-gather) or GPU 0 only:
//
//   ce      one cudaMemcpy2DAsync per call (copy engine, peer write, row pitch 2w)
//   push    SM kernel: each thread loads U 16-byte vectors of x and stores them to the peer
//   push2   push, and each vector also stored to the own output (what the flag kernel does)
//   pull    SM kernel: loads the peer's x over NVLink, stores into the own buffer
//   pushc, push2c, pullc: the same, but CTA b moves one contiguous 1/G of the slice (the
//           all-gather kernels' chunking) instead of the grid striding over all of it
//
// A graph of `calls` back-to-back operations per GPU is replayed `reps` times; each replay's time
// per call is the max over the active GPUs; prints the median. No flags or fences between calls:
// consecutive calls overlap at their edges, so this is the transfer rate, not a call's latency.
// The first call of each mode is checked bit-exact. Not part of the library or the test suite.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -o p2p_ceiling tools/p2p_ceiling.cu
//   ./p2p_ceiling <row bytes> <T> [calls 20] [reps 7] [modes, e.g. ce,push2,push2c; default all]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "graph_timing.cuh"

// mode 0: push, 1: push + own output, 2: pull (src is the peer's x, dst the own buffer)
template <int U>
__global__ void move_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                            uint4* __restrict__ own, uint32_t n, uint32_t wv, uint32_t col0,
                            int mode) {
  // chunked (mode bit 4): CTA b moves the contiguous chunk [n b / G, n (b + 1) / G), as the
  // all-gather kernels do; otherwise the grid strides over the whole slice.
  const bool chunked = mode & 4;
  const uint32_t lo = chunked ? uint32_t(uint64_t(n) * blockIdx.x / gridDim.x) : 0;
  const uint32_t hi = chunked ? uint32_t(uint64_t(n) * (blockIdx.x + 1) / gridDim.x) : n;
  const uint32_t stride = (chunked ? 1 : gridDim.x) * blockDim.x * U;
  mode &= 3;
  n = hi;
  for (uint32_t base = lo + (chunked ? 0 : blockIdx.x * blockDim.x * U) + threadIdx.x; base < n;
       base += stride) {
    uint4 v[U];
    uint32_t t[U], c[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t i = base + u * blockDim.x;
      if (i < n) {
        t[u] = i / wv;
        c[u] = i - t[u] * wv;
        v[u] = src[i];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t i = base + u * blockDim.x;
      if (i < n) {
        const int64_t o = int64_t(t[u]) * (2 * wv) + col0 + c[u];
        dst[o] = v[u];
        if (mode == 1) own[o] = v[u];
      }
    }
  }
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s <row bytes> <T> [calls] [reps]\n", argv[0]);
    return 1;
  }
  const int64_t row_bytes = atoll(argv[1]);
  const int T = atoi(argv[2]);
  const int calls = argc > 3 ? atoi(argv[3]) : 20;
  const int reps = argc > 4 ? atoi(argv[4]) : 7;
  constexpr int W = 2;
  if (row_bytes % 32) {
    fprintf(stderr, "row bytes must be a multiple of 32\n");
    return 1;
  }
  const int64_t w = row_bytes / 2;  // bytes per rank per row
  const uint32_t wv = uint32_t(w / 16);
  const uint32_t n = uint32_t(int64_t(T) * wv);
  const int64_t slice = int64_t(T) * w, full = int64_t(T) * row_bytes;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint8_t *x[W], *buf[W], *own[W];
  cudaStream_t st[W];
  for (int d = 0; d < W; ++d) {
    CK(cudaSetDevice(d));
    cudaError_t r = cudaDeviceEnablePeerAccess(1 - d, 0);
    if (r != cudaSuccess && r != cudaErrorPeerAccessAlreadyEnabled) CK(r);
    CK(cudaMalloc(&x[d], slice));
    CK(cudaMalloc(&buf[d], full));
    CK(cudaMalloc(&own[d], full));
    std::vector<uint8_t> h(slice);
    uint32_t s = 777u + 31u * d;
    for (auto& b : h) b = uint8_t((s = s * 1664525u + 1013904223u) >> 24);
    CK(cudaMemcpy(x[d], h.data(), slice, cudaMemcpyHostToDevice));
    CK(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
  }
  printf("# %lld-byte rows, T=%d: %.2f MB per direction per call, %d calls per graph\n",
         (long long)row_bytes, T, slice / 1e6, calls);
  printf("mode,dirs,blocks,threads,U,us_per_call,GBps_per_dir,ok\n");
  struct Cfg {
    std::string mode;
    int blocks, threads, U;
  };
  const std::string only = argc > 5 ? argv[5] : "";  // comma-separated modes; empty: all
  auto want = [&](const std::string& m) {
    return only.empty() || ("," + only + ",").find("," + m + ",") != std::string::npos;
  };
  std::vector<Cfg> cfgs;
  if (want("ce")) cfgs.push_back({"ce", 0, 0, 0});
  for (const char* m : {"push", "push2", "pull", "pushc", "push2c", "pullc"})
    if (want(m))
    for (int bpsm : {1, 2})
      for (int th : {512, 1024})
        for (int U : {2, 4, 8}) {
          if (bpsm * th > 2048 || (U == 8 && th == 1024)) continue;
          cfgs.push_back({m, bpsm * sms, th, U});
        }
  auto enqueue = [&](const Cfg& c, int d) {
    const int p = 1 - d;
    if (c.mode == "ce") {
      CK(cudaMemcpy2DAsync(buf[p] + d * w, 2 * w, x[d], w, w, T, cudaMemcpyDefault, st[d]));
      return;
    }
    const std::string base = c.mode.back() == 'c' ? c.mode.substr(0, c.mode.size() - 1) : c.mode;
    int mode = base == "push" ? 0 : base == "push2" ? 1 : 2;
    const bool chunk = c.mode != base;
    const uint4* src = reinterpret_cast<const uint4*>(mode == 2 ? x[p] : x[d]);
    uint4* dst = reinterpret_cast<uint4*>(mode == 2 ? buf[d] : buf[p]);
    const uint32_t col0 = (mode == 2 ? p : d) * wv;
    uint4* o = reinterpret_cast<uint4*>(own[d]);
    if (chunk) mode |= 4;
    if (c.U == 2)
      move_kernel<2><<<c.blocks, c.threads, 0, st[d]>>>(src, dst, o, n, wv, col0, mode);
    else if (c.U == 4)
      move_kernel<4><<<c.blocks, c.threads, 0, st[d]>>>(src, dst, o, n, wv, col0, mode);
    else
      move_kernel<8><<<c.blocks, c.threads, 0, st[d]>>>(src, dst, o, n, wv, col0, mode);
    CK(cudaGetLastError());
  };
  for (const Cfg& c : cfgs) {
    for (int dirs : {2, 1}) {
      // one checked call per active GPU
      for (int d = 0; d < W; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaMemset(buf[d], 0, full));
        CK(cudaDeviceSynchronize());  // the memset runs on the legacy stream, not st[d]
      }
      for (int d = 0; d < dirs; ++d) {
        CK(cudaSetDevice(d));
        enqueue(c, d);
      }
      bool ok = true;
      for (int d = 0; d < dirs; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaStreamSynchronize(st[d]));
      }
      for (int d = 0; d < dirs; ++d) {
        // pull: GPU d's buffer holds the peer's slice; push / ce: the peer's buffer holds d's
        const bool pull = c.mode.rfind("pull", 0) == 0;
        const int holder = pull ? d : 1 - d, srcdev = 1 - d == holder ? d : 1 - d;
        std::vector<uint8_t> hb(full), hx(slice);
        CK(cudaSetDevice(holder));
        CK(cudaMemcpy(hb.data(), buf[holder], full, cudaMemcpyDeviceToHost));
        CK(cudaSetDevice(srcdev));
        CK(cudaMemcpy(hx.data(), x[srcdev], slice, cudaMemcpyDeviceToHost));
        for (int t = 0; t < T && ok; ++t)
          ok = memcmp(hb.data() + t * row_bytes + srcdev * w, hx.data() + t * w, w) == 0;
      }
      cudaGraphExec_t ge[W];
      for (int d = 0; d < dirs; ++d) {
        CK(cudaSetDevice(d));
        ge[d] = capture_calls(st[d], calls, [&](int) { enqueue(c, d); });
      }
      const std::vector<double> us = replay_us(ge, st, dirs, calls, reps);
      const double med = us[us.size() / 2];
      printf("%s,%d,%d,%d,%d,%.2f,%.1f,%d\n", c.mode.c_str(), dirs, c.blocks, c.threads, c.U, med,
             slice / med / 1e3, int(ok));
      fflush(stdout);
    }
  }
  return 0;
}
