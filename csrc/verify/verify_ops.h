#pragma once
#include <torch/library.h>
namespace tokenspeed_kernel::verify {
// Schemas of the verify family (defined in verify_ops.cu); none yet.
void define_ops(torch::Library& m);
void impl_cuda(torch::Library& m);
}  // namespace tokenspeed_kernel::verify
