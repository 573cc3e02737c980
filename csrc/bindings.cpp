// The one TORCH_LIBRARY of tokenspeed_kernel: every schema is written here, by hand.
// Kernels live in csrc/<family>/*_ops.cu (torch adapters) over torch-free *.cuh kernels.
#include <Python.h>
#include <torch/library.h>

#include "sampling/sampling_ops.h"
#include "verify/verify_ops.h"
#include "comm/comm_ops.h"

TORCH_LIBRARY(tokenspeed_kernel, m) {
  // ---- sampling (csrc/sampling) ----
  m.def(
      "sample(Tensor logits, Tensor? temperature, Tensor? top_k, Tensor? top_p, Tensor? min_p, "
      "Tensor seed, Tensor offset, int tokens_per_request, int flags, Tensor(a!) tokens, "
      "Tensor(b!) valid, Tensor(c!)? logprobs, Tensor(d!)? processed_logprobs) -> ()");
  // ---- verify (csrc/verify) ----
  tokenspeed_kernel::verify::define_ops(m);
  // ---- comm (csrc/comm) ----
  tokenspeed_kernel::comm::define_ops(m);
  tokenspeed_kernel::comm::define_dp_ops(m);
}

TORCH_LIBRARY_IMPL(tokenspeed_kernel, CUDA, m) {
  m.impl("sample", &tokenspeed_kernel::sampling::sample);
  tokenspeed_kernel::verify::impl_cuda(m);
  tokenspeed_kernel::comm::impl_cuda(m);
  tokenspeed_kernel::comm::impl_dp_cuda(m);
}

// A Python module so that `import tokenspeed_kernel._C` loads the library (and its registrations).
static struct PyModuleDef ts_module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&ts_module); }
