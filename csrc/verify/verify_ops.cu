// Torch adapter of the verify family: schemas, checks, device guard, stream, dtype dispatch.
// Kernels: verify.cuh (torch-free). Python wrapper: python/tokenspeed_kernel/ops/verify.py.
#include "common/check.h"
#include "verify_ops.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdio>

#include "verify.cuh"

namespace tokenspeed_kernel::verify {

namespace {

void check_cuda(const at::Tensor& t, const char* name, const at::Tensor& ref) {
  TS_CHECK(t.is_cuda(), name, ": must be a CUDA tensor");
  TS_CHECK(t.device() == ref.device(), name, ": must be on ", ref.device(), ", got ", t.device());
}
void check_vec(const at::Tensor& t, const char* name, int64_t n, at::ScalarType dtype,
               const at::Tensor& ref) {
  check_cuda(t, name, ref);
  TS_CHECK(t.dim() == 1 && t.size(0) == n, name, ": must have shape [", n, "], got ", t.sizes());
  TS_CHECK(t.scalar_type() == dtype, name, ": must be ", dtype, ", got ", t.scalar_type());
  TS_CHECK(t.is_contiguous(), name, ": must be contiguous");
}
void check_out_tokens(const at::Tensor& tokens, const at::Tensor& num_accepted,
                      const at::Tensor& valid, int64_t bs, int64_t W, const at::Tensor& ref) {
  check_cuda(tokens, "tokens", ref);
  TS_CHECK(
      tokens.dim() == 2 && tokens.size(0) == bs && tokens.size(1) == W && tokens.is_contiguous(),
      "tokens: must be contiguous [", bs, ", ", W, "], got ", tokens.sizes());
  TS_CHECK(tokens.scalar_type() == at::kLong || tokens.scalar_type() == at::kInt,
           "tokens: must be int64 or int32");
  check_vec(num_accepted, "num_accepted", bs, tokens.scalar_type(), ref);
  check_vec(valid, "valid", bs, at::kBool, ref);
}
void check_out_logprobs(const std::optional<at::Tensor>& lp, const std::optional<at::Tensor>& plp,
                        int64_t bs, int64_t W, const at::Tensor& ref) {
  TS_CHECK(lp.has_value() == plp.has_value(),
           "logprobs / processed_logprobs: give both or neither");
  if (!lp.has_value()) return;
  for (const at::Tensor* t : {&*lp, &*plp}) {
    check_cuda(*t, "logprobs", ref);
    TS_CHECK(t->dim() == 2 && t->size(0) == bs && t->size(1) == W && t->is_contiguous() &&
                 t->scalar_type() == at::kFloat,
             "logprobs: must be contiguous float32 [", bs, ", ", W, "]");
  }
}

bool rows_aligned(const at::Tensor& t) {
  const int64_t bytes = t.element_size();
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && (t.stride(0) * bytes) % 16 == 0;
}

}  // namespace

void verify_probabilistic(const at::Tensor& target_logits,
                          const std::optional<at::Tensor>& draft_logits,
                          const at::Tensor& draft_token_ids, const at::Tensor& cu_num_draft,
                          const at::Tensor& seed, const at::Tensor& offset,
                          const std::optional<at::Tensor>& temperature,
                          const std::optional<at::Tensor>& top_k,
                          const std::optional<at::Tensor>& top_p,
                          const std::optional<at::Tensor>& min_p, int64_t max_num_draft,
                          int64_t flags, const at::Tensor& tokens, const at::Tensor& num_accepted,
                          const at::Tensor& valid, const std::optional<at::Tensor>& logprobs,
                          const std::optional<at::Tensor>& processed_logprobs) {
  const at::Tensor& tgt = target_logits;
  check_cuda(tgt, "target_logits", tgt);
  TS_CHECK(tgt.dim() == 2 && (tgt.stride(1) == 1 || tgt.size(1) == 1),
           "target_logits: must be 2-D with a contiguous last dimension");
  const auto dtype = tgt.scalar_type();
  TS_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
           "target_logits: dtype must be float32, bfloat16 or float16");
  const int64_t V = tgt.size(1);
  TS_CHECK(V >= 1 && V <= (int64_t(1) << 24), "target_logits: vocab size must be in [1, 2^24]");
  const int64_t bs = cu_num_draft.size(0) - 1;
  TS_CHECK(bs >= 0, "cu_num_draft: must have shape [bs + 1]");
  check_vec(cu_num_draft, "cu_num_draft", bs + 1, at::kLong, tgt);
  TS_CHECK(max_num_draft >= 0, "max_num_draft: must be >= 0");
  const int64_t W = max_num_draft + 1;
  const bool padded = flags & kPadded, ngram = flags & kNgram;
  check_cuda(draft_token_ids, "draft_token_ids", tgt);
  TS_CHECK(draft_token_ids.dim() == 1 && draft_token_ids.scalar_type() == at::kLong &&
               draft_token_ids.is_contiguous(),
           "draft_token_ids: must be a contiguous flat int64 tensor");
  if (padded) {
    TS_CHECK(tgt.size(0) == bs * W, "target_logits: padded layout needs bs * (max_n + 1) rows");
    TS_CHECK(draft_token_ids.numel() == bs * max_num_draft,
             "draft_token_ids: padded layout needs bs * max_n ids");
  }
  check_vec(seed, "seed", bs, at::kLong, tgt);
  check_vec(offset, "offset", bs, at::kLong, tgt);
  if (temperature.has_value()) check_vec(*temperature, "temperature", bs, at::kFloat, tgt);
  if (min_p.has_value()) check_vec(*min_p, "min_p", bs, at::kFloat, tgt);
  if (top_k.has_value()) check_vec(*top_k, "top_k", bs, at::kInt, tgt);
  if (top_p.has_value()) check_vec(*top_p, "top_p", bs, at::kFloat, tgt);
  TS_CHECK(ngram != draft_logits.has_value(),
           "draft_logits: required in probabilistic mode, absent in ngram mode");
  if (draft_logits.has_value()) {
    const at::Tensor& d = *draft_logits;
    check_cuda(d, "draft_logits", tgt);
    TS_CHECK(d.dim() == 2 && d.size(1) == V && (d.stride(1) == 1 || V == 1),
             "draft_logits: must be 2-D [rows, V] with a contiguous last dimension");
    TS_CHECK(d.scalar_type() == dtype, "draft_logits: dtype must match target_logits");
    TS_CHECK(d.size(0) == draft_token_ids.numel(), "draft_logits: needs one row per draft slot");
  }
  check_out_tokens(tokens, num_accepted, valid, bs, W, tgt);
  check_out_logprobs(logprobs, processed_logprobs, bs, W, tgt);
  if (bs == 0) return;

  const c10::cuda::CUDAGuard guard(tgt.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t R_t = tgt.size(0);
  const int64_t R_d = draft_logits.has_value() ? draft_logits->size(0) : 0;
  at::Tensor ws = at::empty({std::max<int64_t>(R_t, 1) * int64_t(sizeof(PosStats))},
                            tgt.options().dtype(at::kByte));
  const bool filt = top_k.has_value() || top_p.has_value();
  at::Tensor thr;
  if (filt) thr = at::empty({std::max<int64_t>(R_t + R_d, 1)}, tgt.options().dtype(at::kLong));
  VerifyParams p{};
  p.tgt = tgt.data_ptr();
  p.drf = draft_logits.has_value() ? draft_logits->data_ptr() : nullptr;
  p.stride_t = tgt.stride(0);
  p.stride_d = draft_logits.has_value() ? draft_logits->stride(0) : 0;
  p.R_t = R_t;
  p.V = int32_t(V);
  p.bs = int32_t(bs);
  p.max_n = int32_t(max_num_draft);
  p.flags = uint32_t(flags) & (kPadded | kNgram | kExactCoins | kExactResidual | kBisectThresholds |
                               kNoLevelList | kNoLevelExcl | kLevelExclTest);
  const bool list_stats = tuning_enabled() && getenv("TS_VERIFY_LISTSTATS") != nullptr;
  if (list_stats) p.flags |= kListStats;
  if (logprobs.has_value()) p.flags |= kLogprobs;
  p.ids = draft_token_ids.data_ptr<int64_t>();
  p.cu = cu_num_draft.data_ptr<int64_t>();
  p.seed = seed.data_ptr<int64_t>();
  p.offset = offset.data_ptr<int64_t>();
  p.temperature = temperature.has_value() ? temperature->data_ptr<float>() : nullptr;
  p.min_p = min_p.has_value() ? min_p->data_ptr<float>() : nullptr;
  p.top_k = top_k.has_value() ? top_k->data_ptr<int32_t>() : nullptr;
  p.top_p = top_p.has_value() ? top_p->data_ptr<float>() : nullptr;
  p.thr = filt ? thr.data_ptr<int64_t>() : nullptr;
  p.R_d = R_d;
  p.nids = draft_token_ids.numel();
  p.pos = reinterpret_cast<PosStats*>(ws.data_ptr());
  p.tokens = tokens.data_ptr();
  p.num_accepted = num_accepted.data_ptr();
  p.valid = valid.data_ptr<bool>();
  p.lp = logprobs.has_value() ? logprobs->data_ptr<float>() : nullptr;
  p.plp = processed_logprobs.has_value() ? processed_logprobs->data_ptr<float>() : nullptr;
  p.out64 = tokens.scalar_type() == at::kLong;
  const bool vec_ok =
      rows_aligned(tgt) && (!draft_logits.has_value() || rows_aligned(*draft_logits));
  const auto* prop = at::cuda::getDeviceProperties(tgt.get_device());
  const int sms = prop->multiProcessorCount;
  const bool clusters = prop->major >= 9;  // thread-block clusters need sm_90+
  int fsplits;
  switch (dtype) {
    case at::kFloat: fsplits = verify_final_splits<float>(bs, V, sms, vec_ok); break;
    case at::kBFloat16: fsplits = verify_final_splits<__nv_bfloat16>(bs, V, sms, vec_ok); break;
    default: fsplits = verify_final_splits<__half>(bs, V, sms, vec_ok); break;
  }
  // per request: final-kernel candidate (8 B), two arrival counters (8 B), a slot of the
  // exact-path list (4 B); the list's count (4 B); padding to 32 bs; then the first final pass's
  // per-CTA states (16 B each); then the resolve kernel's sums (16 B per target row, or per
  // request if there are fewer rows: the pos kernel zeroes one per row CTA)
  const int64_t rows = std::max<int64_t>(R_t, bs);
  const int64_t state_at = bs * 32, racc_at = state_at + bs * fsplits * 16;
  const int64_t stop_at = racc_at + rows * 16;  // the pos kernel's skip words (4 B / request)
  at::Tensor fws = at::empty({stop_at + bs * 4}, tgt.options().dtype(at::kByte));
  uint8_t* fb = static_cast<uint8_t*>(fws.data_ptr());
  FinalWs fw{};
  fw.cand = reinterpret_cast<unsigned long long*>(fb);
  fw.count = reinterpret_cast<unsigned int*>(fb + bs * 8);
  p.rcount = reinterpret_cast<unsigned int*>(fb + bs * 12);
  p.flist = reinterpret_cast<int32_t*>(fb + bs * 16);
  p.fcount = reinterpret_cast<unsigned int*>(fb + bs * 20);
  fw.state = reinterpret_cast<float4*>(fb + state_at);
  p.racc = reinterpret_cast<unsigned long long*>(fb + racc_at);
  p.stop = reinterpret_cast<int32_t*>(fb + stop_at);
  fw.splits = fsplits;
  // top-k / top-p: the radix thresholds' workspace (not needed by the bisection oracle)
  ThrWs tw{};
  at::Tensor tws;
  if (filt && !(p.flags & kBisectThresholds)) {
    const int64_t trows = R_t + R_d;
    verify_thr_split(trows, int(V), sms, tw.splits, tw.chunk);
    tws = at::empty({std::max<int64_t>(verify_thr_ws_bytes(trows, tw.splits), 1)},
                    tgt.options().dtype(at::kByte));
    tw = verify_thr_ws(static_cast<uint8_t*>(tws.data_ptr()), trows, tw.splits, tw.chunk);
  }
  cudaError_t err;
  switch (dtype) {
    case at::kFloat:
      err = launch_verify_probabilistic<float>(p, sms, clusters, fw, tw, vec_ok, stream);
      break;
    case at::kBFloat16:
      err = launch_verify_probabilistic<__nv_bfloat16>(p, sms, clusters, fw, tw, vec_ok, stream);
      break;
    default:
      err = launch_verify_probabilistic<__half>(p, sms, clusters, fw, tw, vec_ok, stream);
      break;
  }
  TS_CHECK(err == cudaSuccess,
           "verify_probabilistic: kernel launch failed: ", cudaGetErrorString(err));
  if (list_stats) {
    // tuning hook only (bench/lab/tools/verify_listed.py): a host sync, then one line on stderr
    unsigned int c[5] = {0, 0, 0, 0, 0}, fc = 0;
    const unsigned int z[5] = {0, 0, 0, 0, 0};
    TS_CHECK(cudaStreamSynchronize(stream) == cudaSuccess &&
                 cudaMemcpyFromSymbol(c, g_verify_list_stats, sizeof(c)) == cudaSuccess &&
                 cudaMemcpy(&fc, p.fcount, sizeof(fc), cudaMemcpyDeviceToHost) == cudaSuccess &&
                 cudaMemcpyToSymbol(g_verify_list_stats, z, sizeof(z)) == cudaSuccess,
             "verify list statistics: a CUDA call failed");
    fprintf(stderr,
            "verify_list_stats listed=%u unsure=%u wide=%u interval=%u positions=%u skipped=%u\n",
            p.flist != nullptr && !(p.flags & kLogprobs) ? fc : 0u, c[0], c[1], c[2], c[3], c[4]);
  }
}

void verify_strict_accept(const at::Tensor& target_tokens, const at::Tensor& target_valid,
                          const at::Tensor& draft_token_ids, const at::Tensor& cu_num_draft,
                          const std::optional<at::Tensor>& target_logprobs,
                          const std::optional<at::Tensor>& target_processed_logprobs,
                          int64_t max_num_draft, int64_t flags, const at::Tensor& tokens,
                          const at::Tensor& num_accepted, const at::Tensor& valid,
                          const std::optional<at::Tensor>& logprobs,
                          const std::optional<at::Tensor>& processed_logprobs) {
  const at::Tensor& ref = target_tokens;
  const int64_t bs = cu_num_draft.size(0) - 1;
  TS_CHECK(bs >= 0, "cu_num_draft: must have shape [bs + 1]");
  check_vec(cu_num_draft, "cu_num_draft", bs + 1, at::kLong, ref);
  const int64_t R = target_tokens.numel();
  check_vec(target_tokens, "target_tokens", R, at::kLong, ref);
  check_vec(target_valid, "target_valid", R, at::kBool, ref);
  check_cuda(draft_token_ids, "draft_token_ids", ref);
  TS_CHECK(draft_token_ids.dim() == 1 && draft_token_ids.scalar_type() == at::kLong &&
               draft_token_ids.is_contiguous(),
           "draft_token_ids: must be a contiguous flat int64 tensor");
  TS_CHECK(max_num_draft >= 0, "max_num_draft: must be >= 0");
  const int64_t W = max_num_draft + 1;
  if (flags & kPadded) {
    TS_CHECK(R == bs * W, "target_tokens: padded layout needs bs * (max_n + 1) rows");
  }
  check_out_tokens(tokens, num_accepted, valid, bs, W, ref);
  check_out_logprobs(logprobs, processed_logprobs, bs, W, ref);
  TS_CHECK(target_logprobs.has_value() == logprobs.has_value() &&
               target_processed_logprobs.has_value() == logprobs.has_value(),
           "target_logprobs: give the row logprobs exactly when logprobs are wanted");
  if (target_logprobs.has_value()) {
    check_vec(*target_logprobs, "target_logprobs", R, at::kFloat, ref);
    check_vec(*target_processed_logprobs, "target_processed_logprobs", R, at::kFloat, ref);
  }
  if (bs == 0) return;
  const c10::cuda::CUDAGuard guard(ref.device());
  StrictParams p{};
  p.row_tokens = target_tokens.data_ptr<int64_t>();
  p.row_valid = target_valid.data_ptr<bool>();
  p.row_lp = target_logprobs.has_value() ? target_logprobs->data_ptr<float>() : nullptr;
  p.row_plp = target_processed_logprobs.has_value() ? target_processed_logprobs->data_ptr<float>()
                                                    : nullptr;
  p.ids = draft_token_ids.data_ptr<int64_t>();
  p.cu = cu_num_draft.data_ptr<int64_t>();
  p.nids = draft_token_ids.numel();
  p.bs = int32_t(bs);
  p.max_n = int32_t(max_num_draft);
  p.flags = uint32_t(flags) & kPadded;
  p.tokens = tokens.data_ptr();
  p.num_accepted = num_accepted.data_ptr();
  p.valid = valid.data_ptr<bool>();
  p.lp = logprobs.has_value() ? logprobs->data_ptr<float>() : nullptr;
  p.plp = processed_logprobs.has_value() ? processed_logprobs->data_ptr<float>() : nullptr;
  p.out64 = tokens.scalar_type() == at::kLong;
  const cudaError_t err = launch_verify_strict(p, at::cuda::getCurrentCUDAStream());
  TS_CHECK(err == cudaSuccess,
           "verify_strict_accept: kernel launch failed: ", cudaGetErrorString(err));
}

// Schemas: keep identical to python/tokenspeed_kernel/ops/verify.py SCHEMAS (a test compares).
void define_ops(torch::Library& m) {
  m.def(
      "verify_probabilistic(Tensor target_logits, Tensor? draft_logits, Tensor draft_token_ids, "
      "Tensor cu_num_draft, Tensor seed, Tensor offset, Tensor? temperature, Tensor? top_k, "
      "Tensor? top_p, Tensor? min_p, int max_num_draft, int flags, Tensor(a!) tokens, "
      "Tensor(b!) num_accepted, "
      "Tensor(c!) valid, Tensor(d!)? logprobs, Tensor(e!)? processed_logprobs) -> ()");
  m.def(
      "verify_strict_accept(Tensor target_tokens, Tensor target_valid, Tensor draft_token_ids, "
      "Tensor cu_num_draft, Tensor? target_logprobs, Tensor? target_processed_logprobs, "
      "int max_num_draft, int flags, Tensor(a!) tokens, Tensor(b!) num_accepted, "
      "Tensor(c!) valid, Tensor(d!)? logprobs, Tensor(e!)? processed_logprobs) -> ()");
}

void impl_cuda(torch::Library& m) {
  m.impl("verify_probabilistic", &verify_probabilistic);
  m.impl("verify_strict_accept", &verify_strict_accept);
}

}  // namespace tokenspeed_kernel::verify
