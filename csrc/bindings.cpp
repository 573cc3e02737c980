// The one TORCH_LIBRARY of tokenspeed_kernel. Each op family defines its schemas and registers
// its CUDA kernels in csrc/<family>/*_ops.cu (define_ops / impl_cuda: the schemas' one source;
// the tests read them from there), torch adapters over torch-free *.cuh kernels.
#include <Python.h>
#include <torch/library.h>

#include "sampling/sampling_ops.h"
#include "verify/verify_ops.h"
#include "comm/comm_ops.h"

TORCH_LIBRARY(tokenspeed_kernel, m) {
  // ---- sampling (csrc/sampling) ----
  tokenspeed_kernel::sampling::define_ops(m);
  // ---- verify (csrc/verify) ----
  tokenspeed_kernel::verify::define_ops(m);
  // ---- comm (csrc/comm) ----
  tokenspeed_kernel::comm::define_ops(m);
  tokenspeed_kernel::comm::define_dp_ops(m);
}

TORCH_LIBRARY_IMPL(tokenspeed_kernel, CUDA, m) {
  tokenspeed_kernel::sampling::impl_cuda(m);
  tokenspeed_kernel::verify::impl_cuda(m);
  tokenspeed_kernel::comm::impl_cuda(m);
  tokenspeed_kernel::comm::impl_dp_cuda(m);
}

// A Python module so that `import tokenspeed_kernel._C` loads the library (and its registrations).
static struct PyModuleDef ts_module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&ts_module); }
