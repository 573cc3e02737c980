// The request-parameter bits of the sampling ops' `flags` argument, shared by the sampler
// (sampling/sampler.cuh), the verify family's radix-level sampling (sampling/sampling.cuh) and
// ops/sampling.py (tests/test_sampling.py::test_flag_bits_match_cuda_headers checks the copy).
// Each kernel family numbers its own testing / tuning bits from 32 up. Plain ints, so that they
// combine with either family's enum without mixing two enumeration types.
#pragma once

namespace tokenspeed_kernel {

constexpr int F_TEMP = 1;       // temperature tensor given
constexpr int F_TOPK = 2;       // top_k tensor given
constexpr int F_TOPP = 4;       // top_p tensor given
constexpr int F_MINP = 8;       // min_p tensor given
constexpr int F_LOGPROBS = 16;  // logprobs wanted

}  // namespace tokenspeed_kernel
