#pragma once
// NCCL, opened at run time (libnccl.so.2): a GPU's buffers go to a GPU of another rank without
// the host staging them. NCCL is a separate install from the toolkit and the driver, so tandem
// runs where it is absent (the buffers then go through host memory and MPI) and links nothing
// of it. Every wait polls with a deadline and aborts the communicator when it passes: an NCCL
// kernel whose peer died would otherwise spin for ever. (Aborting blocks until NCCL has torn the
// communicator down.)
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::cuda {

// "NCCL 2.28.9" when libnccl.so.2 loads with every function used here; else what is missing.
struct NcclStatus {
  bool loaded = false;
  int version = 0;  // NCCL_VERSION_CODE
  std::string describe;
};
const NcclStatus& nccl_status();  // loads the library the first time

// What one rank makes and the others receive before opening a communicator (ncclUniqueId).
using NcclId = std::array<std::byte, 128>;
NcclId new_nccl_id();

// A communicator of `n_ranks` GPUs, one per rank, this process's being `device` as rank
// `my_rank`. Opening waits for every member for up to `timeout_s`. Errors read
// "<doing>: <why>", `doing` saying what was being done with whom ("rank 0 sending layer 12's
// input to rank 1 over NCCL").
class NcclComm {
 public:
  NcclComm(int device, const NcclId& id, int n_ranks, int my_rank, double timeout_s,
           std::string_view doing);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // `bytes` to (from) member `peer`, in `stream`'s order; returns when they have gone (arrived),
  // or throws tandem::Error after `timeout_s`, with the communicator aborted. A member may be
  // its own peer when it sends and receives in one call (exchange).
  void send(const void* src, size_t bytes, int peer, cudaStream_t stream, double timeout_s,
            std::string_view doing);
  void receive(void* dst, size_t bytes, int peer, cudaStream_t stream, double timeout_s,
               std::string_view doing);
  // Sends `src` to `peer` and receives `dst` from it as one group (both at once: a member that is
  // its own peer needs this).
  void exchange(const void* src, void* dst, size_t bytes, int peer, cudaStream_t stream,
                double timeout_s, std::string_view doing);

 private:
  void transfer(const void* src, void* dst, size_t bytes, int peer, cudaStream_t stream,
                double timeout_s, std::string_view doing);
  void* usable(std::string_view doing) const;  // the communicator, unless an error aborted it
  void settle(double timeout_s, std::string_view doing);
  void wait_for_stream(cudaStream_t stream, double timeout_s, std::string_view doing);
  // Aborts the communicator (after which every call fails) and throws.
  [[noreturn]] void failed(std::string_view doing, const std::string& why);

  int device_;
  void* comm_ = nullptr;  // ncclComm_t; null once aborted
};

}  // namespace tandem::cuda
