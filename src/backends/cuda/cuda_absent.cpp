// Linked instead of the CUDA backend when tandem is built without a CUDA toolkit.
#include "backends/cuda/cuda_devices.h"

#include "core/error.h"

namespace tandem::cuda {

bool built_with_cuda() {
  return false;
}

int count_gpus() {
  return 0;
}

std::vector<GpuInfo> list_gpus() {
  return {};
}

std::unique_ptr<Backend> make_cuda_backend(int index) {
  fail(
      "cuda:{}: this tandem was built without CUDA; install the CUDA toolkit (nvcc) and "
      "rebuild (cmake finds it; -DTANDEM_CUDA=OFF turns it off)",
      index);
}

GpuRates measure_gpu_rates(int index) {
  fail("cuda:{}: this tandem was built without CUDA", index);
}

GpuLinks detect_gpu_links() {
  return {.how = "built without CUDA"};
}

bool nccl_loaded() {
  return false;
}

std::string describe_nccl() {
  return "built without CUDA, so without NCCL";
}

}  // namespace tandem::cuda
