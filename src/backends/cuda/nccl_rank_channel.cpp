// A GPU's buffers to a GPU of another rank over NCCL (core/backend.h's RankChannel): one
// communicator of two members per channel, the sending rank member 0. Its id goes over the host
// transport, which also sets every wait's deadline and counts the traffic.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_devices.h"
#include "backends/cuda/nccl_comm.h"
#include "core/transport.h"

namespace tandem::cuda {
namespace {

class NcclRankChannel final : public RankChannel {
 public:
  NcclRankChannel(CudaBackend& device, Transport& host, int32_t peer, bool sends,
                  std::string_view what)
      : device_(device), host_(host), peer_(peer), member_(sends ? 0 : 1) {
    const std::string id_for = fmt::format("the NCCL id for {}", what);
    if (sends) {
      id_ = new_nccl_id();
      host.send(peer, id_, id_for);
    } else {
      host.receive(peer, id_, id_for);
    }
    comm_ = std::make_unique<NcclComm>(device.device(), id_, 2, member_, host.timeout_s(),
                                       doing("opening a channel for", what, sends));
  }

  void send(const void* device_src, size_t bytes, std::string_view what) override {
    const auto start = std::chrono::steady_clock::now();
    // A host task (the CPU's experts) that failed must stop the step here, as the copy out to
    // host memory would have: the peer must not get a residual missing its part.
    device_.synchronize();
    comm_->send(device_src, bytes, 1 - member_, device_.stream(), host_.timeout_s(),
                doing("sending", what, true));
    host_.count_transfer(true, bytes, seconds_since(start));
  }

  void receive(void* device_dst, size_t bytes, std::string_view what) override {
    const auto start = std::chrono::steady_clock::now();
    comm_->receive(device_dst, bytes, 1 - member_, device_.stream(), host_.timeout_s(),
                   doing("receiving", what, false));
    host_.count_transfer(false, bytes, seconds_since(start));
  }

 private:
  std::string doing(std::string_view verb, std::string_view what, bool sends) const {
    return fmt::format("rank {} {} {} {} rank {} over NCCL ({})", host_.rank(), verb, what,
                       sends ? "to" : "from", peer_, device_.name());
  }
  static double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  CudaBackend& device_;
  Transport& host_;
  int32_t peer_;
  int member_;   // in the communicator of two: 0 on the rank that opened it sending
  NcclId id_{};  // a member: a send that timed out may read it until the run ends
  std::unique_ptr<NcclComm> comm_;
};

}  // namespace

bool nccl_loaded() {
  return nccl_status().loaded;
}

std::string describe_nccl() {
  return nccl_status().describe;
}

RankChannelEnd CudaBackend::rank_channel_end() const {
  const NcclStatus& nccl = nccl_status();
  if (!nccl.loaded) return {};
  char bus_id[32] = {};
  // Which GPU this is on its machine: two ranks on one GPU go through host memory.
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device()) != cudaSuccess) {
    (void)cudaGetLastError();
    std::snprintf(bus_id, sizeof bus_id, "cuda:%d", device());
  }
  return {.kind = RankChannelKind::Nccl,
          .version = uint32_t(nccl.version),
          .device_id = device_id_on_this_machine(bus_id)};
}

std::unique_ptr<RankChannel> CudaBackend::open_rank_channel(Transport& host, int32_t peer,
                                                            bool sends, std::string_view what) {
  return std::make_unique<NcclRankChannel>(*this, host, peer, sends, what);
}

}  // namespace tandem::cuda
