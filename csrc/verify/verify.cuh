// Speculative-decoding verify kernels (torch-free). Spec: python/tokenspeed_kernel/reference/verify.py,
// contract: docs/VERIFY.md. Every float op that decides a token is an explicit round-to-nearest
// intrinsic (softmath.cuh); masses, normalizers and the accept / residual tests are exact integers.
// Processed logits are relative to the raw row max (docs/DESIGN.md, randomness contract):
// y = fl(fl(z - zmax) * invT), 0 at the max (ycen below); keys (top-k / top-p order, greedy
// argmax) are of the raw logits z.
//
// Probabilistic / ngram mode (docs/VERIFY.md has the details):
//   1. verify_pos_kernel: cs CTAs (a thread-block cluster when cs > 1) per target row (=
//      position). Rows without min-p / top-k / top-p read the target and draft chunk once: raw
//      max, lowest id, NaN, approximate mass sums with a proven relative error bound
//      (coin_margin); the accept coin is decided from them when the bound leaves no doubt, else
//      marked kUnsure. Filtered rows take an exact two-pass path. Nothing [rows, V] is written.
//   Without logprobs (two-pass order):
//   2. verify_final_kernel, first pass: `splits` CTAs per request walk to the first position
//      without the accept bit; at a rejection whose sums are approximate they score the
//      residual max(0, p - q) with score intervals (the sums' bounds), and the last CTA decides
//      the token when the best lower end beats every other upper end. An undecided coin or
//      token puts the request on a list (rare).
//   3. verify_resolve_kernel / 4. verify_final_kernel, second pass: only the listed requests
//      (exact sums of the deciding rows, exact coins, then the exact final token), on a fixed
//      grid of one wave with each listed request split finely.
//   With logprobs (one-pass order): resolve kernel for every request (exact sums of the deciding
//   position), then the final kernel (mode 0) exactly.
// Strict mode: the foundation sampler samples every target row; verify_strict_kernel compares.
//
// The code is split by kernel and phase; each part includes the one before it:
//   params.cuh           flags, constants and the kernels' parameter block (VerifyParams)
//   device_common.cuh    small device helpers: loads, reductions, row parameters, row / slot
//                        addressing
//   online.cuh           approximate mass sums (one pass, online), their error bound, the accept
//                        coins
//   pos_kernel.cuh       kernel 1: per-position statistics and accept coins (verify_pos_kernel)
//   resolve_kernel.cuh   kernel 1b: exact sums where they decide something (verify_resolve_kernel)
//   thresholds.cuh       kernel 0 (top-k / top-p only): kept-set thresholds of every target and
//                        draft row
//   final_kernel.cuh     kernel 2: walk + final token, residual resample or bonus sample
//                        (verify_final_kernel)
//   listed_kernel.cuh    kernels 3 + 4 fused: the listed requests' exact path (sm_90 clusters)
//   strict_kernel.cuh    strict accept: one warp per request (verify_strict_kernel)
//   launch.cuh           launchers: grid / cluster policy and the host entry points
#pragma once

#include "verify/launch.cuh"
