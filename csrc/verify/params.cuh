// Verify: flags, constants and the kernels' parameter block (VerifyParams). Part of
// csrc/verify/verify.cuh (the umbrella header); includes the part before it.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>
#include "common/device.cuh"
#include "common/philox.cuh"
#include "common/softmath.cuh"
#include "sampling/sampling.cuh"  // the radix select of the kept-set thresholds (launch_levels)

namespace tokenspeed_kernel::verify {

// kExactCoins (testing): every coin that needs the mass sums is decided by the exact path.
// kExactResidual (testing): every final token the first final pass decides from the approximate
// sums is sent to the exact path instead (after its scan), as an undecided one would be.
// kBisectThresholds (testing): top-k / top-p thresholds by the bisection kernel (the oracle)
// instead of the radix select.
// kListStats (tuning hook only, bench/lab/tools/verify_listed.py): count why requests are listed for the
// exact path in g_verify_list_stats.
// kNoLevelList (testing / A-B): the radix thresholds without the levels' compaction
// (sampling::F_NO_LIST).
// kNoLevelExcl / kLevelExclTest (testing / A-B): sampling::F_NO_EXCL / F_EXCL_TEST.
enum : uint32_t {
  kPadded = 1,
  kNgram = 2,
  kLogprobs = 4,
  kExactCoins = 8,
  kExactResidual = 16,
  kBisectThresholds = 32,
  kListStats = 64,
  kNoLevelList = 128,
  kNoLevelExcl = 256,
  kLevelExclTest = 512
};
// [0] kUnsure coin at the deciding position, [1] bounds too wide (or a testing flag),
// [2] score intervals that did not decide, [3] positions whose exact sums the resolve kernel (or
// the fused listed kernel) computed (per listed request), [4] positions the pos kernel skipped
// (position-major order). Written only with kListStats.
static __device__ unsigned int g_verify_list_stats[5];
// kUnsure: the approximate sums could not decide the coin (the resolve kernel does, exactly).
// kExactS: S_t / S_q are the exact fixed-point sums (else approximations, see verify_pos_kernel).
enum : uint32_t { kActive = 1, kAccept = 2, kBadT = 4, kBadQ = 8, kUnsure = 16, kExactS = 32 };

constexpr int kThreads = 256;
constexpr int kMaxCluster = 16;       // 8 (portable) where 16 cannot be scheduled
constexpr float kMassCut = -26.5f;    // mass_fixed(y) == 0 for all float32 y < -26.34
constexpr float kGumbelSpan = 19.5f;  // G in [-2.8116, 16.6356]: y < -19.45 never wins
constexpr float kLn2Pow38 = 26.33959286127792f;

// Per target row (position) statistics written by pass kernel, read by the final kernel.
struct PosStats {
  int64_t S_t, S_q;      // fixed-point mass sums of the kept sets (target, draft); exact iff
                         // status & kExactS, else within the coin's error bound
  int64_t e_p, e_q;      // exact masses of the draft token (target, draft)
  int64_t thr_t, thr_q;  // top-k / top-p kept-set thresholds (key56 of z; 0 = none)
  float zmax_t, zmax_q;  // raw row max (float32 logits; y = ycen(z, zmax, invT))
  float lse_t;           // raw log-sum-exp of the target row (logprobs only)
  float lp_x, plp_x;     // logprobs of the position's draft token (logprobs only)
  int32_t arg_t, arg_q;  // lowest id of the raw max (greedy rows)
  uint32_t status;       // kActive | kAccept | kBadT | kBadQ
};

struct VerifyParams {
  const void* tgt;
  const void* drf;
  int64_t stride_t, stride_d;
  int64_t R_t;
  int32_t V;
  int32_t bs, max_n;
  uint32_t flags;
  const int64_t* ids;
  const int64_t* cu;
  const int64_t* seed;
  const int64_t* offset;
  const float* temperature;  // nullable (= 1)
  const float* min_p;        // nullable (= 0)
  const int32_t* top_k;      // nullable (= off)
  const float* top_p;        // nullable (= off)
  int64_t* thr;              // [R_t + R_d] key56 thresholds, or null (no top-k / top-p)
  int64_t R_d;
  int64_t nids;        // len(draft_token_ids): a ragged range past it is invalid
  PosStats* pos;       // [R_t]
  void* tokens;        // [bs, max_n + 1] int32 / int64
  void* num_accepted;  // [bs]
  bool* valid;         // [bs]
  float* lp;           // [bs, max_n + 1] or null
  float* plp;
  int32_t out64;
  int32_t chunk;             // pos kernel: vocabulary elements per CTA (multiple of 8)
  int32_t rsplits, rchunk;   // resolve kernel: CTAs per request, elements per CTA
  unsigned long long* cand;  // [bs] final-kernel candidate slots, zeroed by the pos kernel
  unsigned int* count;       // [bs] final-kernel arrival counters, zeroed by the pos kernel
  unsigned long long* racc;  // [2 max(R_t, bs)] resolve-kernel exact sums (S_t, S_q) per target
                             // row, zeroed likewise
  unsigned int* rcount;      // [bs] resolve-kernel arrival counters, zeroed likewise
  int32_t* flist;            // [bs] requests the first final pass sends to the exact path
  unsigned int* fcount;      // their number (zeroed by the pos kernel); flist null: one-pass
                             // order, the resolve kernel runs for every request
  int32_t* stop;             // [bs] or null: the pos kernel's position-major order with skips
                             // (zeroed by the launcher); stop[i] = W - d for the earliest
                             // position d of request i whose coin the pos kernel has decided as
                             // not accepted so far (0 = none yet)
};

}  // namespace tokenspeed_kernel::verify
