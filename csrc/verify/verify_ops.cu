#include "verify_ops.h"
namespace tokenspeed_kernel::verify {
void define_ops(torch::Library&) {}
void impl_cuda(torch::Library&) {}
}  // namespace tokenspeed_kernel::verify
