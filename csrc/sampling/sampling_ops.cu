// Torch adapter of the sampling kernels: checks, device guard, current stream, dtype dispatch,
// workspace. The Python wrapper (ops/sampling.py) validates user input; these checks guard the
// raw op (torch.ops.tokenspeed_kernel.sample) against misuse.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/all.h>

#include "sampling/sampling.cuh"
#include "sampling/sampling_ops.h"

namespace tokenspeed_kernel::sampling {

namespace {
template <typename T>
const T* opt_ptr(const std::optional<at::Tensor>& t, at::ScalarType st, const char* name, int64_t n,
                 const at::Tensor& like) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->scalar_type() == st, name, ": expected dtype ", st, ", got ", t->scalar_type());
  TORCH_CHECK(t->dim() == 1 && t->size(0) == n && t->is_contiguous(), name,
              ": expected a contiguous 1-D tensor of ", n, " values");
  TORCH_CHECK(t->device() == like.device(), name, ": must be on ", like.device());
  return t->data_ptr<T>();
}
}  // namespace

void sample(const at::Tensor& logits, const std::optional<at::Tensor>& temperature,
            const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p,
            const std::optional<at::Tensor>& min_p, const at::Tensor& seed,
            const at::Tensor& offset, int64_t tokens_per_request, int64_t flags,
            const at::Tensor& tokens, const at::Tensor& valid,
            const std::optional<at::Tensor>& logprobs,
            const std::optional<at::Tensor>& processed_logprobs) {
  TORCH_CHECK(logits.is_cuda() && logits.dim() == 2, "logits: expected a 2-D CUDA tensor");
  TORCH_CHECK(logits.stride(1) == 1, "logits: last dimension must be contiguous");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  TORCH_CHECK(vocab >= 1 && vocab <= (1 << 24), "logits: vocab must be in [1, 2^24]");
  TORCH_CHECK(rows < (int64_t(1) << 31), "logits: fewer than 2^31 rows");
  TORCH_CHECK(tokens_per_request >= 1 && rows % tokens_per_request == 0,
              "tokens_per_request: must divide rows");
  const int64_t n = rows / tokens_per_request;
  const at::cuda::CUDAGuard guard(logits.device());
  Params p{};
  p.row0 = 0;
  p.logits = logits.data_ptr();
  p.row_stride = logits.stride(0);
  p.rows = int(rows);
  p.vocab = int(vocab);
  p.tpr = int(tokens_per_request);
  p.flags = int(flags) & ~(F_TEMP | F_TOPK | F_TOPP | F_MINP | F_THRESHOLDS);
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
  TORCH_CHECK(tokens.is_cuda() && tokens.numel() == rows && tokens.is_contiguous() &&
                  (tokens.scalar_type() == at::kLong || tokens.scalar_type() == at::kInt),
              "tokens: expected a contiguous int64/int32 CUDA tensor of ", rows, " values");
  TORCH_CHECK(valid.is_cuda() && valid.numel() == rows && valid.scalar_type() == at::kBool &&
                  valid.is_contiguous(), "valid: expected a contiguous bool tensor of ", rows);
  const bool want_lp = flags & F_LOGPROBS;
  float* lp = nullptr;
  float* plp = nullptr;
  if (want_lp) {
    TORCH_CHECK(logprobs.has_value() && processed_logprobs.has_value(),
                "logprobs/processed_logprobs: required when the logprobs flag is set");
    for (const auto* t : {&*logprobs, &*processed_logprobs})
      TORCH_CHECK(t->is_cuda() && t->numel() == rows && t->scalar_type() == at::kFloat &&
                      t->is_contiguous(), "logprobs: expected contiguous float32 of ", rows);
    lp = logprobs->data_ptr<float>();
    plp = processed_logprobs->data_ptr<float>();
  }
  if (rows == 0) return;

  int sms = 0;
  TORCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, logits.get_device()) ==
              cudaSuccess, "cudaDeviceGetAttribute failed");
  p.splits = choose_splits(int(rows), int(vocab), sms);
  int64_t chunk = (vocab + p.splits - 1) / p.splits;
  chunk = (chunk + 7) / 8 * 8;
  p.chunk = int(chunk);
  p.splits = int((vocab + chunk - 1) / chunk);

  // workspace (caching allocator: graph-safe; generic buffers only when the path may run)
  const bool generic = flags & F_GENERIC;
  const int64_t np = rows * p.splits;
  const int64_t part_bytes = np * int64_t(sizeof(Partial));
  const int64_t cand_bytes = (p.top_k ? np * kTopKCap * 8 : 0);
  const int64_t level_bytes = generic ? level_ws_bytes(rows, p.splits) : 0;
  const int64_t total = ws_align(part_bytes) * (generic ? 2 : 1) + ws_align(cand_bytes) +
                        level_bytes;
  at::Tensor wsbuf = at::empty({total}, logits.options().dtype(at::kByte));
  uint8_t* base = wsbuf.data_ptr<uint8_t>();
  Workspace ws{};
  ws.part = reinterpret_cast<Partial*>(base); base += ws_align(part_bytes);
  if (generic) { ws.part1 = reinterpret_cast<Partial*>(base); base += ws_align(part_bytes); }
  ws.cand = reinterpret_cast<unsigned long long*>(base); base += ws_align(cand_bytes);
  if (generic) level_ws_carve(base, rows, p.splits, ws);   // state, histograms, lists

  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(logits.get_device());
  cudaError_t err = cudaSuccess;
  auto run = [&](auto tag_in) {
    using T = decltype(tag_in);
    if (tokens.scalar_type() == at::kLong)
      err = launch_sample<T, int64_t>(p, ws, tokens.data_ptr<int64_t>(), valid.data_ptr<bool>(),
                                      lp, plp, stream);
    else
      err = launch_sample<T, int32_t>(p, ws, tokens.data_ptr<int32_t>(), valid.data_ptr<bool>(),
                                      lp, plp, stream);
  };
  switch (logits.scalar_type()) {
    case at::kFloat: run(float{}); break;
    case at::kHalf: run(__half{}); break;
    case at::kBFloat16: run(__nv_bfloat16{}); break;
    default: TORCH_CHECK(false, "logits: dtype must be float32, float16 or bfloat16");
  }
  TORCH_CHECK(err == cudaSuccess, "tokenspeed_kernel.sample: CUDA error: ", cudaGetErrorString(err));
}

}  // namespace tokenspeed_kernel::sampling
