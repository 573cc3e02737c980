// Torch adapter of the sampling kernel: checks, device guard, current stream, dtype dispatch.
// The Python wrapper (ops/sampling.py) validates user input; these checks guard the raw op
// (torch.ops.tokenspeed_kernel.sample) against misuse. One launch per call (two, PDL-overlapped,
// for the split launch of small temperature / greedy batches, with a per-call workspace).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/all.h>
#include <torch/library.h>

#include "common/check.h"
#include "sampling/sampler.cuh"
#include "sampling/sampling_ops.h"

namespace tokenspeed_kernel::sampling {

namespace {
template <typename T>
const T* opt_ptr(const std::optional<at::Tensor>& t, at::ScalarType st, const char* name, int64_t n,
                 const at::Tensor& like) {
  if (!t.has_value()) return nullptr;
  TS_CHECK(t->scalar_type() == st, name, ": expected dtype ", st, ", got ", t->scalar_type());
  TS_CHECK(t->dim() == 1 && t->size(0) == n && t->is_contiguous(), name,
           ": expected a contiguous 1-D tensor of ", n, " values");
  TS_CHECK(t->device() == like.device(), name, ": must be on ", like.device());
  return t->data_ptr<T>();
}
}  // namespace

void sample(const at::Tensor& logits, const std::optional<at::Tensor>& temperature,
            const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p,
            const std::optional<at::Tensor>& min_p, const at::Tensor& seed,
            const at::Tensor& offset, int64_t tokens_per_request, int64_t flags,
            const at::Tensor& tokens, const at::Tensor& valid,
            const std::optional<at::Tensor>& logprobs,
            const std::optional<at::Tensor>& processed_logprobs,
            const std::optional<c10::List<std::optional<at::Tensor>>>& processing) {
  using namespace tokenspeed_kernel::sampler;
  // logits processing (the trailing list: [] or the 16 inputs of ops/sampling.py's
  // PROC_FIELDS) is applied by the Triton and reference backends; these kernels do not take it
  TS_CHECK(!processing.has_value() || processing->size() == 0,
           "processing: the CUDA sampler does not apply logits processing; use "
           "backend='triton' (backend='auto' takes Triton for calls with processing)");
  TS_CHECK(logits.is_cuda() && logits.dim() == 2, "logits: expected a 2-D CUDA tensor");
  TS_CHECK(logits.stride(1) == 1 || logits.size(1) == 1,
           "logits: last dimension must be contiguous");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  TS_CHECK(vocab >= 1 && vocab <= (1 << 24), "logits: vocab must be in [1, 2^24]");
  TS_CHECK(rows < (int64_t(1) << 27), "logits: fewer than 2^27 rows");
  TS_CHECK(tokens_per_request >= 1 && rows % tokens_per_request == 0,
           "tokens_per_request: must divide rows");
  const int64_t n = rows / tokens_per_request;
  const at::cuda::CUDAGuard guard(logits.device());
  Params p{};
  p.logits = logits.data_ptr();
  p.stride = logits.stride(0);
  p.rows = int(rows);
  p.vocab = int(vocab);
  p.tpr = int(tokens_per_request);
  p.flags = int(flags) & (F_LOGPROBS | F_FORCE_GENERIC | F_FORCE_EXACT | F_NO_RESIDENT |
                          F_NO_SPLIT | (7 << F_CS_SHIFT));
  p.temperature = opt_ptr<float>(temperature, at::kFloat, "temperature", n, logits);
  p.top_k = opt_ptr<int>(top_k, at::kInt, "top_k", n, logits);
  p.top_p = opt_ptr<float>(top_p, at::kFloat, "top_p", n, logits);
  p.min_p = opt_ptr<float>(min_p, at::kFloat, "min_p", n, logits);
  if (p.temperature) p.flags |= F_TEMP;
  if (p.top_k) p.flags |= F_TOPK;
  if (p.top_p) p.flags |= F_TOPP;
  if (p.min_p) p.flags |= F_MINP;
  p.seed = opt_ptr<int64_t>(seed, at::kLong, "seed", n, logits);
  p.offset = opt_ptr<int64_t>(offset, at::kLong, "offset", n, logits);
  TS_CHECK(tokens.is_cuda() && tokens.numel() == rows && tokens.is_contiguous() &&
               (tokens.scalar_type() == at::kLong || tokens.scalar_type() == at::kInt),
           "tokens: expected a contiguous int64/int32 CUDA tensor of ", rows, " values");
  TS_CHECK(valid.is_cuda() && valid.numel() == rows && valid.scalar_type() == at::kBool &&
               valid.is_contiguous(),
           "valid: expected a contiguous bool tensor of ", rows);
  TS_CHECK(tokens.device() == logits.device() && valid.device() == logits.device(),
           "tokens/valid: must be on ", logits.device());
  if (flags & F_LOGPROBS) {
    TS_CHECK(logprobs.has_value() && processed_logprobs.has_value(),
             "logprobs/processed_logprobs: required when the logprobs flag is set");
    for (const auto* t : {&*logprobs, &*processed_logprobs})
      TS_CHECK(t->is_cuda() && t->numel() == rows && t->scalar_type() == at::kFloat &&
                   t->is_contiguous() && t->device() == logits.device(),
               "logprobs: expected contiguous float32 of ", rows);
    p.lp = logprobs->data_ptr<float>();
    p.plp = processed_logprobs->data_ptr<float>();
  }
  p.tokens = tokens.data_ptr();
  p.out64 = tokens.scalar_type() == at::kLong;
  p.valid = valid.data_ptr<bool>();
  p.stats = nullptr;
  if (rows == 0) return;
  TS_CHECK(p.seed && p.offset, "seed/offset: required");

  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(logits.get_device());
  // small batches of temperature / greedy rows: the split launch's workspace, one per call from
  // the caching allocator (stream-ordered; inside a CUDA graph, from the graph's pool)
  int split = 0;
  switch (logits.scalar_type()) {
    case at::kFloat: split = split_ctas<float>(p); break;
    case at::kHalf: split = split_ctas<__half>(p); break;
    case at::kBFloat16: split = split_ctas<__nv_bfloat16>(p); break;
    default: TS_CHECK(false, "logits: dtype must be float32, float16 or bfloat16");
  }
  at::Tensor ws;
  if (split) {
    ws = at::empty({int64_t(split_ws_bytes(p, split))},
                   at::TensorOptions().dtype(at::kByte).device(logits.device()));
    p.ws = ws.data_ptr();
  }
  cudaError_t err = cudaSuccess;
  switch (logits.scalar_type()) {
    case at::kFloat: err = launch<float>(p, stream); break;
    case at::kHalf: err = launch<__half>(p, stream); break;
    default: err = launch<__nv_bfloat16>(p, stream); break;
  }
  TS_CHECK(err == cudaSuccess, "tokenspeed_kernel.sample: CUDA error: ", cudaGetErrorString(err));
}

void define_ops(torch::Library& m) {
  m.def(
      "sample(Tensor logits, Tensor? temperature, Tensor? top_k, Tensor? top_p, Tensor? min_p, "
      "Tensor seed, Tensor offset, int tokens_per_request, int flags, Tensor(a!) tokens, "
      "Tensor(b!) valid, Tensor(c!)? logprobs, Tensor(d!)? processed_logprobs, "
      "Tensor?[]? processing=None) -> ()");
}

void impl_cuda(torch::Library& m) { m.impl("sample", &sample); }

}  // namespace tokenspeed_kernel::sampling
