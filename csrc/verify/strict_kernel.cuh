// Verify: strict accept: one warp per request (verify_strict_kernel). Part of
// csrc/verify/verify.cuh (the umbrella header); includes the part before it.
#pragma once

#include "verify/listed_kernel.cuh"

namespace tokenspeed_kernel::verify {

// ------------------------------------------------------------------------------------------
// strict accept: one warp per request
// ------------------------------------------------------------------------------------------
struct StrictParams {
  const int64_t* row_tokens;
  const bool* row_valid;
  const float* row_lp;  // nullable
  const float* row_plp;
  const int64_t* ids;
  const int64_t* cu;
  int64_t nids;  // len(draft_token_ids): a ragged range past it is invalid
  int32_t bs, max_n;
  uint32_t flags;
  void* tokens;
  void* num_accepted;
  bool* valid;
  float* lp;
  float* plp;
  int32_t out64;
};

__global__ void __launch_bounds__(128) verify_strict_kernel(const StrictParams p) {
  const int i = int(blockIdx.x) * 4 + int(threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (i >= p.bs) return;
  const bool padded = p.flags & kPadded;
  const int64_t n_req = p.cu[i + 1] - p.cu[i];
  const int W = p.max_n + 1;
  // (ragged: a range outside the draft ids, unvalidated cu, would read past the tensors)
  if (n_req < 0 || n_req > int64_t(p.max_n) ||
      (!padded && (p.cu[i] < 0 || p.cu[i] + n_req > p.nids))) {
    // a wrong bound that reached the kernel unvalidated: the request is invalid (token 0 in slot
    // 0, -1 after it, 0 accepted, NaN logprob) and none of its rows or draft slots is read
    for (int j = lane; j < W; j += 32) {
      const int64_t o = int64_t(i) * W + j;
      if (p.out64)
        static_cast<int64_t*>(p.tokens)[o] = j == 0 ? 0 : -1;
      else
        static_cast<int32_t*>(p.tokens)[o] = j == 0 ? 0 : -1;
      if (p.lp) {
        p.lp[o] = j == 0 ? NAN : 0.0f;
        p.plp[o] = j == 0 ? NAN : 0.0f;
      }
    }
    if (lane == 0) {
      if (p.out64)
        static_cast<int64_t*>(p.num_accepted)[i] = 0;
      else
        static_cast<int32_t*>(p.num_accepted)[i] = 0;
      p.valid[i] = false;
    }
    return;
  }
  const int n = int(n_req);
  auto trow = [&](int j) -> int64_t { return padded ? int64_t(i) * W + j : p.cu[i] + i + j; };
  auto dslot = [&](int j) -> int64_t { return padded ? int64_t(i) * p.max_n + j : p.cu[i] + j; };
  int f = n;
  for (int base = 0; base < n; base += 32) {
    const int j = base + lane;
    bool fail = false;
    if (j < n) {
      const int64_t r = trow(j);
      fail = !p.row_valid[r] || p.row_tokens[r] != p.ids[dslot(j)];
    }
    const unsigned bal = __ballot_sync(0xffffffffu, fail);
    if (bal) {
      f = base + __ffs(bal) - 1;
      break;
    }
  }
  const int64_t rf = trow(f);
  for (int j = lane; j < W; j += 32) {
    const int64_t o = int64_t(i) * W + j;
    const int64_t tok = j < f ? p.ids[dslot(j)] : (j == f ? p.row_tokens[rf] : -1);
    if (p.out64)
      static_cast<int64_t*>(p.tokens)[o] = tok;
    else
      static_cast<int32_t*>(p.tokens)[o] = int32_t(tok);
    if (p.lp) {
      p.lp[o] = j <= f ? p.row_lp[trow(j)] : 0.0f;
      p.plp[o] = j <= f ? p.row_plp[trow(j)] : 0.0f;
    }
  }
  if (lane == 0) {
    if (p.out64)
      static_cast<int64_t*>(p.num_accepted)[i] = f;
    else
      static_cast<int32_t*>(p.num_accepted)[i] = f;
    p.valid[i] = p.row_valid[rf];
  }
}

}  // namespace tokenspeed_kernel::verify
