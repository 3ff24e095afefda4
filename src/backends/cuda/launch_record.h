#pragma once
// What the CUDA backend launches, as the host sees it: every kernel launcher goes through
// launch.cuh, which, while a RecordLaunches is alive on the calling thread, appends the kernel's
// name, grid and block here and launches nothing. The launchers' own choices (which kernels, how
// many, their grids) then run on a machine without a GPU, which is how a host test counts what a
// decode step launches (tests/cuda/cuda_launch_test.cpp). No CUDA header: plain C++.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::cuda {

struct KernelLaunch {
  std::string kernel;  // the kernel's name in the source
  uint32_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  size_t shared_bytes = 0;
};

class RecordLaunches {
 public:
  explicit RecordLaunches(std::vector<KernelLaunch>& into);
  ~RecordLaunches();
  RecordLaunches(const RecordLaunches&) = delete;
  RecordLaunches& operator=(const RecordLaunches&) = delete;

 private:
  std::vector<KernelLaunch>* previous_;
};

// Whether launches on this thread are being recorded (launch.cuh then records instead).
bool recording_launches();
// Records one launch when recording and says whether it did (then the caller launches nothing).
bool record_launch(const char* kernel, const uint32_t grid[3], const uint32_t block[3],
                   size_t shared_bytes);

}  // namespace tandem::cuda
