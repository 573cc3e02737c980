// Prints, for the pos kernels the verify launcher uses, the resident CTAs per SM and the cluster
// capacity (cudaOccupancyMaxActiveClusters x size) for every cluster size, on the current GPU:
// the launcher's own queries (resident_per_sm, max_cluster, cluster_capacity).
//   nvcc -std=c++20 -O3 -arch=sm_90a -I csrc bench/lab/tools/verify_occupancy.cu -o /tmp/vo && /tmp/vo
#include <cstdio>

#include "verify/verify.cuh"

using namespace tokenspeed_kernel::verify;

template <typename Kernel>
void report(const char* name, Kernel kernel, int sms) {
  cudaFuncAttributes a{};
  cudaFuncGetAttributes(&a, kernel);
  std::printf("%s: %d registers, %d CTAs/SM (%d resident)", name, a.numRegs,
              resident_per_sm(kernel), resident_per_sm(kernel) * sms);
  // the launcher's own queries; max_cluster first: it sets the non-portable attribute 16 needs
  const int mc = max_cluster(kernel);
  std::printf(", max cluster %d, cs 2: %d CTAs, cs 4: %d CTAs, cs 8: %d CTAs, cs 16: %d CTAs", mc,
              cluster_capacity<2>(kernel), cluster_capacity<4>(kernel),
              cluster_capacity<8>(kernel), cluster_capacity<16>(kernel));
  std::printf("\n");
}

int main() {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const int sms = prop.multiProcessorCount;
  report("fp32 single ", verify_pos_kernel<float, 4, false, 4>, sms);
  report("fp32 cluster", verify_pos_kernel<float, 4, true, 4>, sms);
  report("bf16 single ", verify_pos_kernel<__nv_bfloat16, 8, false, 2>, sms);
  report("bf16 cluster", verify_pos_kernel<__nv_bfloat16, 8, true, 2>, sms);
  return 0;
}
