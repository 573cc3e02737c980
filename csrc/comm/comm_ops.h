#pragma once
#include <torch/library.h>
namespace tokenspeed_kernel::comm {
// Schemas of the comm family (defined in comm_ops.cu).
void define_ops(torch::Library& m);
void impl_cuda(torch::Library& m);
}  // namespace tokenspeed_kernel::comm
