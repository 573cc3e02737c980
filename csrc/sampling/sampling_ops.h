#pragma once
#include <optional>
#include <ATen/core/Tensor.h>
namespace tokenspeed_kernel::sampling {
void sample(const at::Tensor& logits, const std::optional<at::Tensor>& temperature,
            const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p,
            const std::optional<at::Tensor>& min_p, const at::Tensor& seed,
            const at::Tensor& offset, int64_t tokens_per_request, int64_t flags,
            const at::Tensor& tokens, const at::Tensor& valid, const std::optional<at::Tensor>& logprobs,
            const std::optional<at::Tensor>& processed_logprobs);
}  // namespace tokenspeed_kernel::sampling
