// What can cross NVLink between the GPUs of one host, with no protocol at all: the ceiling against
// which the flag protocol's share of the floor is judged (docs/COMM.md, "What bounds the vocab
// row"). One process, cudaMalloc + peer access, no multicast. With G GPUs (default 2) every mode
// moves each GPU's slice `x[T, w]` (w = row bytes / G) into every other GPU's `[T, G w]` buffer
// at its column offset, the all-gather's layout, all GPUs at once (the all-gather's case) or GPU 0
// only:
//
//   ce      one cudaMemcpy2DAsync per peer per call (copy engine, peer write; with > 1 peer each
//           on its own forked stream, so the copies to different peers run concurrently)
//   push    SM kernel: each thread loads U 16-byte vectors of x and stores them to every peer
//           (in index order, as the all-gather kernels do)
//   push2   push, and each vector also stored to the own output (what the flag kernel does)
//   pull    SM kernel: loads every peer's x over NVLink, stores into the own buffer
//   pushc, push2c, pullc: the same, but CTA b moves one contiguous 1/B of the slice (the
//           all-gather kernels' chunking before 6797ec7) instead of the grid striding over it
//
// A graph of `calls` back-to-back operations per GPU is replayed `reps` times; each replay's time
// per call is the max over the active GPUs; prints the median. No flags or fences between calls:
// consecutive calls overlap at their edges, so this is the transfer rate, not a call's latency.
// The first call of each mode is checked bit-exact. Not part of the library or the test suite.
// GBps_per_dir = the bytes one active GPU sends per call ((G - 1) slices) / time; with every GPU
// active that is also the bytes each one receives.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -o p2p_ceiling bench/lab/tools/p2p_ceiling.cu
//   ./p2p_ceiling <row bytes> <T> [calls 20] [reps 7] [modes, e.g. ce,push2,push2c; default all]
//                 [GPUs 2]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "graph_timing.cuh"

constexpr int kMaxGpus = 8;
struct Peers {
  uint4* p[kMaxGpus - 1];  // push: the peers' buffers; pull: unused
  const uint4* s[kMaxGpus - 1];  // pull: the peers' slices; push: unused
  uint32_t col0[kMaxGpus - 1];  // pull: each peer's column offset (vectors) in the own buffer
  int n;  // peers
};

// Loads the U vectors i = base + u * blockDim.x (< n) of s, with their row t and column c;
// kNc: through the non-coherent path (the push's own x), else plain loads (the pull's peer x).
template <int U, bool kNc>
__device__ __forceinline__ void load_u(const uint4* s, uint32_t base, uint32_t n, uint32_t wv,
                                       uint4 (&v)[U], uint32_t (&t)[U], uint32_t (&c)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const uint32_t i = base + u * blockDim.x;
    if (i < n) {
      t[u] = i / wv;
      c[u] = i - t[u] * wv;
      v[u] = kNc ? __ldg(s + i) : s[i];
    }
  }
}

// mode 0: push, 1: push + own output, 2: pull (from every peer's x into the own buffer)
template <int U>
__global__ void move_kernel(const uint4* __restrict__ src, Peers peers, uint4* __restrict__ own,
                            uint32_t n, uint32_t wv, uint32_t rowv, uint32_t col0, int mode) {
  // chunked (mode bit 4): CTA b moves the contiguous chunk [n b / B, n (b + 1) / B); otherwise
  // the grid strides over the whole slice.
  const bool chunked = mode & 4;
  const uint32_t lo = chunked ? uint32_t(uint64_t(n) * blockIdx.x / gridDim.x) : 0;
  const uint32_t hi = chunked ? uint32_t(uint64_t(n) * (blockIdx.x + 1) / gridDim.x) : n;
  const uint32_t stride = (chunked ? 1 : gridDim.x) * blockDim.x * U;
  mode &= 3;
  n = hi;
  for (uint32_t base = lo + (chunked ? 0 : blockIdx.x * blockDim.x * U) + threadIdx.x; base < n;
       base += stride) {
    if (mode == 2) {  // pull: one peer at a time, U vectors in flight
      for (int k = 0; k < peers.n; ++k) {
        uint4 v[U];
        uint32_t t[U], c[U];
        load_u<U, false>(peers.s[k], base, n, wv, v, t, c);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const uint32_t i = base + u * blockDim.x;
          if (i < n) own[int64_t(t[u]) * rowv + peers.col0[k] + c[u]] = v[u];
        }
      }
      continue;
    }
    uint4 v[U];
    uint32_t t[U], c[U];
    load_u<U, true>(src, base, n, wv, v, t, c);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t i = base + u * blockDim.x;
      if (i < n) {
        const int64_t o = int64_t(t[u]) * rowv + col0 + c[u];
        for (int k = 0; k < peers.n; ++k) peers.p[k][o] = v[u];
        if (mode == 1) own[o] = v[u];
      }
    }
  }
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s <row bytes> <T> [calls] [reps] [modes] [GPUs]\n", argv[0]);
    return 1;
  }
  const int64_t row_bytes = atoll(argv[1]);
  const int T = atoi(argv[2]);
  const int calls = argc > 3 ? atoi(argv[3]) : 20;
  const int reps = argc > 4 ? atoi(argv[4]) : 7;
  const std::string only = argc > 5 ? argv[5] : "";  // comma-separated modes; empty: all
  const int W = argc > 6 ? atoi(argv[6]) : 2;
  int ngpu = 0;
  CK(cudaGetDeviceCount(&ngpu));
  if (W < 2 || W > kMaxGpus || W > ngpu) {
    fprintf(stderr, "GPUs must be in [2, min(%d, visible = %d)], got %d\n", kMaxGpus, ngpu, W);
    return 1;
  }
  if (row_bytes % (16 * W)) {
    fprintf(stderr, "row bytes must be a multiple of 16 x GPUs\n");
    return 1;
  }
  const int64_t w = row_bytes / W;  // bytes per rank per row
  const uint32_t wv = uint32_t(w / 16), rowv = uint32_t(row_bytes / 16);
  const uint32_t n = uint32_t(int64_t(T) * wv);
  const int64_t slice = int64_t(T) * w, full = int64_t(T) * row_bytes;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint8_t *x[kMaxGpus], *buf[kMaxGpus], *own[kMaxGpus];
  cudaStream_t st[kMaxGpus], side[kMaxGpus][kMaxGpus - 1];
  cudaEvent_t fork[kMaxGpus], join[kMaxGpus][kMaxGpus - 1];
  for (int d = 0; d < W; ++d) {
    CK(cudaSetDevice(d));
    for (int p = 0; p < W; ++p) {
      if (p == d) continue;
      cudaError_t r = cudaDeviceEnablePeerAccess(p, 0);
      if (r != cudaSuccess && r != cudaErrorPeerAccessAlreadyEnabled) CK(r);
    }
    CK(cudaMalloc(&x[d], slice));
    CK(cudaMalloc(&buf[d], full));
    CK(cudaMalloc(&own[d], full));
    std::vector<uint8_t> h(slice);
    uint32_t s = 777u + 31u * d;
    for (auto& b : h) b = uint8_t((s = s * 1664525u + 1013904223u) >> 24);
    CK(cudaMemcpy(x[d], h.data(), slice, cudaMemcpyHostToDevice));
    CK(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&fork[d], cudaEventDisableTiming));
    for (int k = 0; k < W - 1; ++k) {
      CK(cudaStreamCreateWithFlags(&side[d][k], cudaStreamNonBlocking));
      CK(cudaEventCreateWithFlags(&join[d][k], cudaEventDisableTiming));
    }
  }
  printf("# %d GPUs, %lld-byte rows, T=%d: %.2f MB per slice, each GPU sends %d slices per call, "
         "%d calls per graph\n",
         W, (long long)row_bytes, T, slice / 1e6, W - 1, calls);
  printf("mode,dirs,blocks,threads,U,us_per_call,GBps_per_dir,ok\n");
  struct Cfg {
    std::string mode;
    int blocks, threads, U;
  };
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
  auto peer = [&](int d, int k) { return k < d ? k : k + 1; };  // k-th peer of GPU d
  auto enqueue = [&](const Cfg& c, int d) {
    if (c.mode == "ce") {
      if (W == 2) {
        CK(cudaMemcpy2DAsync(buf[peer(d, 0)] + d * w, row_bytes, x[d], w, w, T,
                             cudaMemcpyDefault, st[d]));
        return;
      }
      CK(cudaEventRecord(fork[d], st[d]));
      for (int k = 0; k < W - 1; ++k) {
        CK(cudaStreamWaitEvent(side[d][k], fork[d], 0));
        CK(cudaMemcpy2DAsync(buf[peer(d, k)] + d * w, row_bytes, x[d], w, w, T,
                             cudaMemcpyDefault, side[d][k]));
        CK(cudaEventRecord(join[d][k], side[d][k]));
        CK(cudaStreamWaitEvent(st[d], join[d][k], 0));
      }
      return;
    }
    const std::string base = c.mode.back() == 'c' ? c.mode.substr(0, c.mode.size() - 1) : c.mode;
    int mode = base == "push" ? 0 : base == "push2" ? 1 : 2;
    const bool chunk = c.mode != base;
    Peers pr{};
    pr.n = W - 1;
    for (int k = 0; k < W - 1; ++k) {
      const int p = peer(d, k);
      pr.p[k] = reinterpret_cast<uint4*>(buf[p]);
      pr.s[k] = reinterpret_cast<const uint4*>(x[p]);
      pr.col0[k] = p * wv;
    }
    const uint4* src = reinterpret_cast<const uint4*>(x[d]);
    // push2 stores the own copy into `own`; pull stores the peers' slices into the own buffer
    uint4* o = reinterpret_cast<uint4*>(mode == 2 ? buf[d] : own[d]);
    if (chunk) mode |= 4;
    if (c.U == 2)
      move_kernel<2><<<c.blocks, c.threads, 0, st[d]>>>(src, pr, o, n, wv, rowv, d * wv, mode);
    else if (c.U == 4)
      move_kernel<4><<<c.blocks, c.threads, 0, st[d]>>>(src, pr, o, n, wv, rowv, d * wv, mode);
    else
      move_kernel<8><<<c.blocks, c.threads, 0, st[d]>>>(src, pr, o, n, wv, rowv, d * wv, mode);
    CK(cudaGetLastError());
  };
  std::vector<uint8_t> hb(full), hx(slice);
  for (const Cfg& c : cfgs) {
    for (int dirs : {W, 1}) {
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
      for (int d = 0; d < dirs; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaStreamSynchronize(st[d]));
      }
      // push / ce: every peer's buffer holds the active GPU d's slice at column d w;
      // pull: the active GPU d's buffer holds every peer's slice
      const bool pull = c.mode.rfind("pull", 0) == 0;
      bool ok = true;
      for (int d = 0; d < dirs && ok; ++d)
        for (int k = 0; k < W - 1 && ok; ++k) {
          const int holder = pull ? d : peer(d, k), srcdev = pull ? peer(d, k) : d;
          CK(cudaSetDevice(holder));
          CK(cudaMemcpy(hb.data(), buf[holder], full, cudaMemcpyDeviceToHost));
          CK(cudaSetDevice(srcdev));
          CK(cudaMemcpy(hx.data(), x[srcdev], slice, cudaMemcpyDeviceToHost));
          for (int t = 0; t < T && ok; ++t)
            ok = memcmp(hb.data() + t * row_bytes + srcdev * w, hx.data() + t * w, w) == 0;
        }
      cudaGraphExec_t ge[kMaxGpus];
      for (int d = 0; d < dirs; ++d) {
        CK(cudaSetDevice(d));
        ge[d] = capture_calls(st[d], calls, [&](int) { enqueue(c, d); });
      }
      const std::vector<double> us = replay_us(ge, st, dirs, calls, reps);
      const double med = us[us.size() / 2];
      printf("%s,%d,%d,%d,%d,%.2f,%.1f,%d\n", c.mode.c_str(), dirs, c.blocks, c.threads, c.U, med,
             (W - 1) * slice / med / 1e3, int(ok));
      fflush(stdout);
    }
  }
  return 0;
}
