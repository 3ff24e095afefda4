// NCCL through dlopen (nccl_comm.h). nccl.h gives the types and declarations; the functions are
// looked up in the library at run time, so nothing of NCCL is linked. Communicators are
// non-blocking (ncclConfig_t::blocking = 0): opening and enqueueing return at once and the caller
// polls ncclCommGetAsyncError, which is what lets every wait have a deadline (abort and destroy
// still block while NCCL tears down).
#include "backends/cuda/nccl_comm.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "backends/cuda/cuda_check.h"
#include "core/error.h"

namespace tandem::cuda {
namespace {

struct NcclLibrary {
  void* handle = nullptr;
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclCommFinalize) finalize = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetLastError) last_error = nullptr;
  NcclStatus status;

  NcclLibrary() {
    constexpr const char* kName = "libnccl.so.2";
    handle = dlopen(kName, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = dlerror();
      status.describe = fmt::format(
          "no NCCL ({}: {}): GPU buffers cross ranks through host memory; install NCCL "
          "(libnccl2) or put its lib folder on LD_LIBRARY_PATH",
          kName, why ? why : "not found");
      return;
    }
    const char* missing = nullptr;
    auto find = [&](auto& function, const char* name) {
      function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(handle, name));
      if (!function && !missing) missing = name;
    };
    find(get_version, "ncclGetVersion");
    find(get_unique_id, "ncclGetUniqueId");
    find(init_rank, "ncclCommInitRankConfig");
    find(async_error, "ncclCommGetAsyncError");
    find(finalize, "ncclCommFinalize");
    find(destroy, "ncclCommDestroy");
    find(abort, "ncclCommAbort");
    find(send, "ncclSend");
    find(recv, "ncclRecv");
    find(group_start, "ncclGroupStart");
    find(group_end, "ncclGroupEnd");
    find(error_string, "ncclGetErrorString");
    find(last_error, "ncclGetLastError");
    int version = 0;
    if (missing || get_version(&version) != ncclSuccess) {
      status.describe = fmt::format(
          "{} has no {}: NCCL 2.14 or later is needed for GPU buffers to cross ranks directly "
          "(they go through host memory)",
          kName, missing ? missing : "version");
      return;
    }
    // NCCL_VERSION_CODE: major*1000 + minor*100 + patch up to 2.8, major*10000 + minor*100 + patch
    // since 2.9.
    const int major = version >= 10000 ? version / 10000 : version / 1000;
    const int minor = version >= 10000 ? version / 100 % 100 : version / 100 % 10;
    status.loaded = true;
    status.version = version;
    status.describe = fmt::format("NCCL {}.{}.{}", major, minor, version % 100);
  }
};

NcclLibrary& library() {
  static NcclLibrary nccl;
  return nccl;
}

NcclLibrary& loaded_library() {
  NcclLibrary& nccl = library();
  if (!nccl.status.loaded) fail("{}", nccl.status.describe);
  return nccl;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Between polls: a short spin first (a decode step's activations arrive within microseconds),
// then brief sleeps, so that a wait for a slow peer does not hold a core.
void pause_between_polls(int polls) {
  if (polls < 1000)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}

}  // namespace

const NcclStatus& nccl_status() {
  return library().status;
}

NcclId new_nccl_id() {
  NcclLibrary& nccl = loaded_library();
  ncclUniqueId id;
  if (const ncclResult_t result = nccl.get_unique_id(&id); result != ncclSuccess)
    fail("NCCL could not make a communicator id: {} ({})", nccl.error_string(result),
         nccl.last_error(nullptr));
  static_assert(sizeof(id) == sizeof(NcclId));
  NcclId bytes;
  std::memcpy(bytes.data(), &id, sizeof(id));
  return bytes;
}

NcclComm::NcclComm(int device, const NcclId& id, int n_ranks, int my_rank, double timeout_s,
                   std::string_view doing)
    : device_(device) {
  NcclLibrary& nccl = loaded_library();
  if (const cudaError_t error = cudaSetDevice(device); error != cudaSuccess)
    failed(doing, fmt::format("cuda:{}: {}", device, cudaGetErrorString(error)));
  ncclUniqueId nccl_id;
  std::memcpy(&nccl_id, id.data(), sizeof(nccl_id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t result = nccl.init_rank(&comm, n_ranks, nccl_id, my_rank, &config);
  comm_ = comm;
  if (result != ncclSuccess && result != ncclInProgress)
    failed(doing, fmt::format("{} ({})", nccl.error_string(result), nccl.last_error(comm)));
  settle(timeout_s, doing);
}

NcclComm::~NcclComm() {
  if (!comm_) return;
  NcclLibrary& nccl = library();
  auto comm = static_cast<ncclComm_t>(comm_);
  // Finalizing flushes what is in flight; a peer that no longer answers leaves it pending, and
  // then abort is the only way out.
  ncclResult_t state = nccl.finalize(comm);
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0; state == ncclInProgress && seconds_since(start) < 5; ++polls) {
    pause_between_polls(polls);
    nccl.async_error(comm, &state);
  }
  if (state == ncclSuccess)
    nccl.destroy(comm);
  else
    nccl.abort(comm);
}

void NcclComm::send(const void* src, size_t bytes, int peer, cudaStream_t stream, double timeout_s,
                    std::string_view doing) {
  transfer(src, nullptr, bytes, peer, stream, timeout_s, doing);
}

void NcclComm::receive(void* dst, size_t bytes, int peer, cudaStream_t stream, double timeout_s,
                       std::string_view doing) {
  transfer(nullptr, dst, bytes, peer, stream, timeout_s, doing);
}

void NcclComm::exchange(const void* src, void* dst, size_t bytes, int peer, cudaStream_t stream,
                        double timeout_s, std::string_view doing) {
  transfer(src, dst, bytes, peer, stream, timeout_s, doing);
}

// A send (src), a receive (dst) or both as one group, enqueued on `stream` and waited for.
void NcclComm::transfer(const void* src, void* dst, size_t bytes, int peer, cudaStream_t stream,
                        double timeout_s, std::string_view doing) {
  NcclLibrary& nccl = library();
  auto comm = static_cast<ncclComm_t>(usable(doing));
  TANDEM_CUDA_CHECK(cudaSetDevice(device_));
  ncclResult_t results[3] = {ncclSuccess, ncclSuccess, ncclSuccess};
  nccl.group_start();
  if (src) results[0] = nccl.send(src, bytes, ncclUint8, peer, comm, stream);
  if (dst) results[1] = nccl.recv(dst, bytes, ncclUint8, peer, comm, stream);
  results[2] = nccl.group_end();
  for (const ncclResult_t r : results)
    if (r != ncclSuccess && r != ncclInProgress) failed(doing, nccl.error_string(r));
  settle(timeout_s, doing);
  wait_for_stream(stream, timeout_s, doing);
}

// Until the communicator has taken the last call (init, or an op's enqueueing).
void NcclComm::settle(double timeout_s, std::string_view doing) {
  NcclLibrary& nccl = library();
  auto comm = static_cast<ncclComm_t>(comm_);
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    if (const ncclResult_t r = nccl.async_error(comm, &state); r != ncclSuccess) state = r;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress)
      failed(doing, fmt::format("{} ({})", nccl.error_string(state), nccl.last_error(comm)));
    if (seconds_since(start) > timeout_s)
      failed(doing, fmt::format("no answer in {} s: the peer may have died or its link dropped",
                                timeout_s));
    pause_between_polls(polls);
  }
}

// Until the stream has run the op: its kernel ends only when the peer has taken part.
void NcclComm::wait_for_stream(cudaStream_t stream, double timeout_s, std::string_view doing) {
  NcclLibrary& nccl = library();
  auto comm = static_cast<ncclComm_t>(comm_);
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    const cudaError_t done = cudaStreamQuery(stream);
    if (done == cudaSuccess) return;
    if (done != cudaErrorNotReady) failed(doing, cudaGetErrorString(done));
    ncclResult_t state = ncclSuccess;
    if (const ncclResult_t r = nccl.async_error(comm, &state); r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress)
      failed(doing, fmt::format("{} ({})", nccl.error_string(state), nccl.last_error(comm)));
    if (seconds_since(start) > timeout_s)
      failed(doing, fmt::format("not done in {} s: the peer may have died or its link dropped",
                                timeout_s));
    pause_between_polls(polls);
  }
}

void* NcclComm::usable(std::string_view doing) const {
  if (!comm_) fail("{}: its NCCL communicator was aborted after an earlier error", doing);
  return comm_;
}

// Aborting ends the communicator's kernels, so the stream does not hang behind them.
void NcclComm::failed(std::string_view doing, const std::string& why) {
  if (comm_) library().abort(static_cast<ncclComm_t>(comm_));
  comm_ = nullptr;
  fail("{}: {}", doing, why);
}

}  // namespace tandem::cuda
