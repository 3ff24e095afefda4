// Linked instead of nccl_comm.cpp when the toolkit has no nccl.h (NCCL is a separate install):
// GPU buffers then cross ranks through host memory.
#include "backends/cuda/nccl_comm.h"

#include "core/error.h"

namespace tandem::cuda {

const NcclStatus& nccl_status() {
  static const NcclStatus absent{
      .loaded = false,
      .describe =
          "built without NCCL (no nccl.h beside the CUDA toolkit's headers): GPU buffers "
          "cross ranks through host memory; install NCCL's headers and build again"};
  return absent;
}

NcclId new_nccl_id() {
  fail("{}", nccl_status().describe);
}

NcclComm::NcclComm(int device, const NcclId&, int, int, double, std::string_view doing)
    : device_(device) {
  fail("{}: {}", doing, nccl_status().describe);
}

NcclComm::~NcclComm() = default;

// Never reached (the constructor throws), but said rather than silently doing nothing.
void NcclComm::send(const void*, size_t, int, cudaStream_t, double, std::string_view doing) {
  fail("{}: {}", doing, nccl_status().describe);
}
void NcclComm::receive(void*, size_t, int, cudaStream_t, double, std::string_view doing) {
  fail("{}: {}", doing, nccl_status().describe);
}
void NcclComm::exchange(const void*, void*, size_t, int, cudaStream_t, double,
                        std::string_view doing) {
  fail("{}: {}", doing, nccl_status().describe);
}

}  // namespace tandem::cuda
