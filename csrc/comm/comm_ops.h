#pragma once
#include <optional>

#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace tokenspeed_kernel::comm {
// Schemas of the comm family (defined in comm_ops.cu).
void define_ops(torch::Library& m);
void impl_cuda(torch::Library& m);
// DP sampling's swap and results gather (dp_ops.cu).
void define_dp_ops(torch::Library& m);
void impl_dp_cuda(torch::Library& m);

// all_gather_hidden(x, out?, state, symm, peer_data, peer_flags, mc_data, col_offsets, rank,
//                   buf_bytes, num_blocks, flags, timeout_ns, ll_off=0, ll_bytes=0) -> ()
//                   (see comm_ops.cu)
void all_gather_hidden(const at::Tensor& x, const std::optional<at::Tensor>& out,
                       const at::Tensor& state, const at::Tensor& symm, at::IntArrayRef peer_data,
                       at::IntArrayRef peer_flags, int64_t mc_data, at::IntArrayRef col_offsets,
                       int64_t rank, int64_t buf_bytes, int64_t num_blocks, int64_t flags,
                       int64_t timeout_ns, int64_t ll_off, int64_t ll_bytes);
}  // namespace tokenspeed_kernel::comm
