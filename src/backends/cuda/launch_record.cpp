#include "backends/cuda/launch_record.h"

namespace tandem::cuda {
namespace {

thread_local std::vector<KernelLaunch>* recording = nullptr;

}  // namespace

RecordLaunches::RecordLaunches(std::vector<KernelLaunch>& into) : previous_(recording) {
  recording = &into;
}

RecordLaunches::~RecordLaunches() {
  recording = previous_;
}

bool recording_launches() {
  return recording != nullptr;
}

bool record_launch(const char* kernel, const uint32_t grid[3], const uint32_t block[3],
                   size_t shared_bytes) {
  if (!recording) return false;
  KernelLaunch& l = recording->emplace_back();
  l.kernel = kernel;
  for (int i = 0; i < 3; ++i) l.grid[i] = grid[i], l.block[i] = block[i];
  l.shared_bytes = shared_bytes;
  return true;
}

}  // namespace tandem::cuda
