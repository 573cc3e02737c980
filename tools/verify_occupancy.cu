// Prints, for the pos kernels the verify launcher uses, the resident CTAs per SM and the cluster
// capacity (cudaOccupancyMaxActiveClusters x size) for every cluster size, on the current GPU.
//   nvcc -std=c++20 -O3 -arch=sm_90a -I csrc tools/verify_occupancy.cu -o /tmp/vo && /tmp/vo
#include <cstdio>

#include "verify/verify.cuh"

using namespace tokenspeed_kernel::verify;

template <typename Kernel>
void report(const char* name, Kernel kernel, int sms) {
  cudaFuncAttributes a{};
  cudaFuncGetAttributes(&a, kernel);
  std::printf("%s: %d registers, %d CTAs/SM (%d resident)", name, a.numRegs,
              resident_per_sm(kernel), resident_per_sm(kernel) * sms);
  cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  for (int s = 2; s <= 16; s *= 2) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(s), 1, 1);
    cfg.blockDim = dim3(kThreads, 1, 1);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = s;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
    std::printf(", cs %d: %d CTAs", s, e == cudaSuccess ? clusters * s : -1);
    (void)cudaGetLastError();
  }
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
