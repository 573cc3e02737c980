// Torch adapter of the sampling kernel: checks, device guard, current stream, dtype dispatch.
// The Python wrapper (ops/sampling.py) validates user input; these checks guard the raw op
// (torch.ops.tokenspeed_kernel.sample) against misuse. One launch per call (two, PDL-overlapped,
// for the split launch of small temperature / greedy batches, with a per-call workspace), plus
// the processing prep (sampling/processing.cuh) before it when banned / stop ids or a logit
// bias are given.
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

// The raw op's `processing` list (ops/sampling.py PROC_FIELDS: [] or 16 entries, None = that
// input off) -> the kernels' ProcParams and the prep's arguments; checks dtypes, shapes, devices
// and the inputs' dependencies (values are ops.sample's `validate`). The scratch of the prep
// (keep / has-bias words, bias hash) is allocated into `scratch`.
struct ProcList {
  const c10::List<std::optional<at::Tensor>>& l;
  const at::Tensor& like;
  int64_t n;
  std::optional<at::Tensor> get(int i, const char* name, at::ScalarType st,
                                std::initializer_list<int64_t> shape) const {
    std::optional<at::Tensor> t = l.get(i);
    if (!t.has_value()) return t;
    TS_CHECK(t->scalar_type() == st, "processing.", name, ": expected dtype ", st, ", got ",
             t->scalar_type());
    TS_CHECK(t->device() == like.device(), "processing.", name, ": must be on ", like.device());
    TS_CHECK(t->is_contiguous(), "processing.", name, ": must be contiguous");
    TS_CHECK(t->dim() == int64_t(shape.size()), "processing.", name, ": expected ",
             int64_t(shape.size()), " dimensions, got ", t->dim());
    int d = 0;
    for (int64_t s : shape) {
      TS_CHECK(s < 0 || t->size(d) == s, "processing.", name, ": expected shape ",
               c10::IntArrayRef(shape), " (-1: any), got ", t->sizes());
      ++d;
    }
    return t;
  }
};

template <typename T>
T* ptr(const std::optional<at::Tensor>& t) {
  return t.has_value() ? static_cast<T*>(t->data_ptr()) : nullptr;
}

void prepare_processing(const c10::List<std::optional<at::Tensor>>& list, const at::Tensor& logits,
                        int64_t n, sampler::ProcParams& pp, sampler::ProcPrep& prep,
                        at::Tensor& scratch) {
  using namespace sampler;
  TS_CHECK(list.size() == 16, "processing: expected [] or the 16 inputs of ops.sampling.",
           "PROC_FIELDS, got ", int64_t(list.size()));
  const int64_t V = logits.size(1), W = (V + 31) / 32;
  const ProcList L{list, logits, n};
  const auto kL = at::kLong, kI = at::kInt, kF = at::kFloat;
  auto bias_ip = L.get(0, "bias_indptr", kL, {n + 1});
  auto bias_ids = L.get(1, "bias_ids", kL, {-1});
  auto bias_val = L.get(2, "bias_values", kF, {bias_ids ? bias_ids->size(0) : -1});
  TS_CHECK(
      bias_ip.has_value() == bias_ids.has_value() && bias_ids.has_value() == bias_val.has_value(),
      "processing.logit_bias: indptr, ids and values go together");
  auto rep = L.get(3, "repetition_penalty", kF, {n});
  auto freq = L.get(4, "frequency_penalty", kF, {n});
  auto pres = L.get(5, "presence_penalty", kF, {n});
  auto seen = L.get(6, "seen", kI, {-1, W});
  const int64_t N = seen ? seen->size(0) : 0;
  auto counts = L.get(7, "output_counts", kI, {N, V});
  auto slots = L.get(8, "count_slots", kL, {n});
  const bool pen = rep || freq || pres;
  TS_CHECK(!pen || (seen && counts && slots), "processing.counts: the repetition / frequency / ",
           "presence penalties need seen, output_counts and count_slots");
  auto allowed = L.get(9, "allowed_mask", kI, {n, W});
  auto ban_ip = L.get(10, "banned_indptr", kL, {n + 1});
  auto ban_ids = L.get(11, "banned_ids", kL, {-1});
  TS_CHECK(ban_ip.has_value() == ban_ids.has_value(),
           "processing.banned: indptr and ids go together");
  auto min_t = L.get(12, "min_tokens", kL, {n});
  auto nout = L.get(13, "num_output_tokens", kL, {n});
  auto stop_ip = L.get(14, "stop_indptr", kL, {n + 1});
  auto stop_ids = L.get(15, "stop_ids", kL, {-1});
  TS_CHECK(min_t.has_value() == nout.has_value() && nout.has_value() == stop_ip.has_value() &&
               stop_ip.has_value() == stop_ids.has_value(),
           "processing.min_tokens: num_output_tokens, stop_indptr and stop_ids go with it");
  const int64_t bias_nnz = bias_ids ? bias_ids->size(0) : 0;
  TS_CHECK(bias_nnz < (int64_t(1) << 31), "processing.logit_bias: fewer than 2^31 entries");
  const bool build_keep = ban_ip.has_value() || min_t.has_value();
  const bool has_bias = bias_nnz > 0;  // (an empty bias list changes nothing)
  // scratch: keep words, has-bias words (int32 [n, W] each), bias hash (u64 [2 nnz])
  const int64_t words = n * W;
  const int64_t keep_off = 0, hasb_off = build_keep ? words * 4 : 0;
  const int64_t tab_off = ((hasb_off + (has_bias ? words * 4 : 0)) + 7) / 8 * 8;
  const int64_t bytes = tab_off + (has_bias ? 16 * bias_nnz : 0);
  if (bytes > 0)
    scratch = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(logits.device()));
  auto* base = bytes > 0 ? static_cast<unsigned char*>(scratch.data_ptr()) : nullptr;

  pp = ProcParams{};
  pp.vocab = int(V);
  pp.words = int(W);
  if (build_keep)
    pp.keep = reinterpret_cast<const uint32_t*>(base + keep_off);
  else if (allowed)
    pp.keep = ptr<const uint32_t>(allowed);  // an allowed mask alone: read directly
  if (has_bias) {
    pp.hasb = reinterpret_cast<const uint32_t*>(base + hasb_off);
    pp.btab = reinterpret_cast<const unsigned long long*>(base + tab_off);
    pp.bias_indptr = ptr<const int64_t>(bias_ip);
    pp.bias_values = ptr<const float>(bias_val);
    pp.bias_nnz = bias_nnz;
  }
  if (pen) {
    pp.rep = ptr<const float>(rep);
    pp.freq = ptr<const float>(freq);
    pp.pres = ptr<const float>(pres);
    pp.seen = ptr<const uint32_t>(seen);
    pp.counts = ptr<const int32_t>(counts);
    pp.slots = ptr<const int64_t>(slots);
    pp.nslots = N;
  }
  prep = ProcPrep{};
  prep.vocab = int(V);
  prep.words = int(W);
  if (build_keep) {
    prep.keep = reinterpret_cast<uint32_t*>(base + keep_off);
    prep.allowed = ptr<const uint32_t>(allowed);
    prep.ban_indptr = ptr<const int64_t>(ban_ip);
    prep.ban_ids = ptr<const int64_t>(ban_ids);
    prep.ban_nnz = ban_ids ? ban_ids->size(0) : 0;
    prep.min_tokens = ptr<const int64_t>(min_t);
    prep.num_output = ptr<const int64_t>(nout);
    prep.stop_indptr = ptr<const int64_t>(stop_ip);
    prep.stop_ids = ptr<const int64_t>(stop_ids);
    prep.stop_nnz = stop_ids ? stop_ids->size(0) : 0;
  }
  if (has_bias) {
    prep.hasb = reinterpret_cast<uint32_t*>(base + hasb_off);
    prep.btab = reinterpret_cast<unsigned long long*>(base + tab_off);
    prep.bias_indptr = ptr<const int64_t>(bias_ip);
    prep.bias_ids = ptr<const int64_t>(bias_ids);
    prep.bias_nnz = bias_nnz;
  }
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
  p.flags = int(flags) & kCallerFlags;
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
  // logits processing (the trailing list: [] or the 16 inputs of ops/sampling.py's
  // PROC_FIELDS), applied inside the kernels' reads of the logits
  at::Tensor proc_scratch;
  ProcPrep prep{};
  if (processing.has_value() && processing->size() > 0)
    prepare_processing(*processing, logits, n, p.proc, prep, proc_scratch);
  if (rows == 0) return;
  TS_CHECK(p.seed && p.offset, "seed/offset: required");

  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(logits.get_device());
  if (proc_on(p.proc)) {
    const cudaError_t e = launch_proc_prep(prep, int(n), stream);
    TS_CHECK(e == cudaSuccess,
             "tokenspeed_kernel.sample: CUDA error (processing prep): ", cudaGetErrorString(e));
  }
  // small batches: the split launches' workspace (temperature / greedy rows: split_ctas; with
  // a top-k tensor: scand_ctas); large batches with a top-p tensor: the wide deferral's queue
  // (wide_defer_ok). One per call from the caching allocator (stream-ordered; inside a CUDA
  // graph, from the graph's pool)
  int split = 0, scand = 0;
  bool wide = false;
  switch (logits.scalar_type()) {
    case at::kFloat:
      split = split_ctas<float>(p), scand = scand_ctas<float>(p);
      wide = !split && !scand && wide_defer_ok<float>(p);
      break;
    case at::kHalf:
      split = split_ctas<__half>(p), scand = scand_ctas<__half>(p);
      wide = !split && !scand && wide_defer_ok<__half>(p);
      break;
    case at::kBFloat16:
      split = split_ctas<__nv_bfloat16>(p), scand = scand_ctas<__nv_bfloat16>(p);
      wide = !split && !scand && wide_defer_ok<__nv_bfloat16>(p);
      break;
    default: TS_CHECK(false, "logits: dtype must be float32, float16 or bfloat16");
  }
  at::Tensor ws;
  if (split || scand || wide) {
    const size_t bytes =
        split ? split_ws_bytes(p, split) : (scand ? scand_ws_bytes(p, scand) : kWideWsBytes);
    ws = at::empty({int64_t(bytes)}, at::TensorOptions().dtype(at::kByte).device(logits.device()));
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
