// Shared by the standalone multi-GPU tools (bench/lab/tools/ag_micro.cu, bench/lab/tools/p2p_ceiling.cu): error
// check, capture of N back-to-back operations per GPU into a graph, and the replay timing the
// comm bench also uses -- per replay the time per call is the max over the GPUs, the first
// replay is a warm-up. Not part of the library.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(2);                                                                           \
    }                                                                                    \
  } while (0)

// A graph of `calls` operations enqueued by enqueue(k) on `stream` (device already set).
template <typename Enqueue>
inline cudaGraphExec_t capture_calls(cudaStream_t stream, int calls, Enqueue enqueue) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < calls; ++k) enqueue(k);
  CK(cudaStreamEndCapture(stream, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphDestroy(g));
  return ge;
}

// Replays ge[d] on st[d] for GPUs d < n, reps + 1 times (all GPUs launched together each time;
// the first replay is a warm-up), and returns the sorted per-call µs, max over the GPUs.
// Destroys the graphs.
inline std::vector<double> replay_us(cudaGraphExec_t* ge, cudaStream_t* st, int n, int calls,
                                     int reps) {
  std::vector<double> us;
  std::vector<cudaEvent_t> e0(n), e1(n);
  for (int r = 0; r < reps + 1; ++r) {
    for (int d = 0; d < n; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaEventCreate(&e0[d]));
      CK(cudaEventCreate(&e1[d]));
    }
    for (int d = 0; d < n; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaEventRecord(e0[d], st[d]));
      CK(cudaGraphLaunch(ge[d], st[d]));
      CK(cudaEventRecord(e1[d], st[d]));
    }
    double worst = 0;
    for (int d = 0; d < n; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaEventSynchronize(e1[d]));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0[d], e1[d]));
      worst = std::max(worst, double(ms) * 1000.0 / calls);
      CK(cudaEventDestroy(e0[d]));
      CK(cudaEventDestroy(e1[d]));
    }
    if (r > 0) us.push_back(worst);
  }
  for (int d = 0; d < n; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaGraphExecDestroy(ge[d]));
  }
  std::sort(us.begin(), us.end());
  return us;
}
