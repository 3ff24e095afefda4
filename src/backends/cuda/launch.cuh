#pragma once
// The one way the CUDA backend's launchers start a kernel: checked like every launch
// (cuda_check.h), and recorded instead of launched while a RecordLaunches is alive on the
// calling thread (launch_record.h), so that what a step launches can be read without a GPU.
#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/launch_record.h"

namespace tandem::cuda {

template <typename... Params, typename... Args>
void launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared,
            cudaStream_t stream, const Args&... args) {
  const uint32_t g[3] = {grid.x, grid.y, grid.z}, b[3] = {block.x, block.y, block.z};
  if (record_launch(name, g, b, shared)) return;
  kernel<<<grid, block, shared, stream>>>(args...);
  TANDEM_CUDA_CHECK(cudaGetLastError());  // configuration errors (threads, shared memory)
}

}  // namespace tandem::cuda
