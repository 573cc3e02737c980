#pragma once
#include <optional>
#include <ATen/core/Tensor.h>
#include <torch/library.h>
namespace tokenspeed_kernel::sampling {
void sample(const at::Tensor& logits, const std::optional<at::Tensor>& temperature,
            const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p,
            const std::optional<at::Tensor>& min_p, const at::Tensor& seed,
            const at::Tensor& offset, int64_t tokens_per_request, int64_t flags,
            const at::Tensor& tokens, const at::Tensor& valid,
            const std::optional<at::Tensor>& logprobs,
            const std::optional<at::Tensor>& processed_logprobs,
            const std::optional<c10::List<std::optional<at::Tensor>>>& processing);
// The family's schemas (torch.ops.tokenspeed_kernel.sample) and CUDA kernels.
void define_ops(torch::Library& m);
void impl_cuda(torch::Library& m);
}  // namespace tokenspeed_kernel::sampling
