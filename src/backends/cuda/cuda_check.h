#pragma once
// CUDA errors as tandem::Error: every runtime call and every launch is checked, and a failure
// names the call and the device's error string (a launch's own errors show at the next check;
// launches go through launch.cuh).
// Declared here without fmt so that the .cu files need no host-only headers.
#include <cuda_runtime_api.h>

namespace tandem::cuda {

[[noreturn]] void cuda_failed(cudaError_t error, const char* call, const char* file, int line);

}  // namespace tandem::cuda

#define TANDEM_CUDA_CHECK(call)                                                   \
  do {                                                                            \
    const cudaError_t tandem_cuda_error_ = (call);                                \
    if (tandem_cuda_error_ != cudaSuccess)                                        \
      ::tandem::cuda::cuda_failed(tandem_cuda_error_, #call, __FILE__, __LINE__); \
  } while (0)
