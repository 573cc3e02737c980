#include "comm_ops.h"
namespace tokenspeed_kernel::comm {
void define_ops(torch::Library&) {}
void impl_cuda(torch::Library&) {}
}  // namespace tokenspeed_kernel::comm
