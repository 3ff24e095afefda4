// A GPU's buffers to a GPU of another rank over NCCL (core/backend.h's RankChannel): one
// communicator of two members per channel, the sending rank member 0. Its id goes over the host
// transport, which also sets every wait's deadline and counts the traffic.
#include <fmt/format.h>

#include <chrono>
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
      : device_(device), host_(host), peer_(peer), sends_(sends) {
    NcclId id{};
    const std::string id_for = fmt::format("the NCCL id for {}", what);
    if (sends) {
      id = new_nccl_id();
      host.send(peer, id, id_for);
    } else {
      host.receive(peer, id, id_for);
    }
    comm_ = std::make_unique<NcclComm>(device.device(), id, 2, sends ? 0 : 1, host.timeout_s(),
                                       doing("opening a channel for", what));
  }

  void send(const void* device_src, size_t bytes, std::string_view what) override {
    const auto start = std::chrono::steady_clock::now();
    comm_->send(device_src, bytes, 1, device_.stream(), host_.timeout_s(), doing("sending", what));
    host_.count_transfer(true, bytes, seconds_since(start));
  }

  void receive(void* device_dst, size_t bytes, std::string_view what) override {
    const auto start = std::chrono::steady_clock::now();
    comm_->receive(device_dst, bytes, 0, device_.stream(), host_.timeout_s(),
                   doing("receiving", what));
    host_.count_transfer(false, bytes, seconds_since(start));
  }

 private:
  std::string doing(std::string_view verb, std::string_view what) const {
    return fmt::format("rank {} {} {} {} rank {} over NCCL ({})", host_.rank(), verb, what,
                       sends_ ? "to" : "from", peer_, device_.name());
  }
  static double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  CudaBackend& device_;
  Transport& host_;
  int32_t peer_;
  bool sends_;
  std::unique_ptr<NcclComm> comm_;
};

}  // namespace

bool nccl_loaded() {
  return nccl_status().loaded;
}

std::string describe_nccl() {
  return nccl_status().describe;
}

RankChannelKind CudaBackend::rank_channel_kind() const {
  return nccl_status().loaded ? RankChannelKind::Nccl : RankChannelKind::ThroughHost;
}

std::unique_ptr<RankChannel> CudaBackend::open_rank_channel(Transport& host, int32_t peer,
                                                            bool sends, std::string_view what) {
  return std::make_unique<NcclRankChannel>(*this, host, peer, sends, what);
}

}  // namespace tandem::cuda
