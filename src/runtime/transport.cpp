// The single-process transport, the factory, and checks over any transport (transport.h).
#include "runtime/transport.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace tandem {

#if TANDEM_HAVE_MPI
// runtime/mpi_transport.cpp: nullptr when the process is not one of several MPI ranks.
std::unique_ptr<Transport> open_mpi_transport(const TransportOptions& options);
#endif

namespace {

// A run of one rank: collectives copy to themselves; there is no peer to send to.
class SingleProcess : public Transport {
 public:
  int32_t rank() const override { return 0; }
  int32_t n_ranks() const override { return 1; }
  std::string describe() const override { return "single process"; }
  void set_timeout(double seconds) override { timeout_s_ = seconds; }
  double timeout_s() const override { return timeout_s_; }
  void send(int32_t to, std::span<const std::byte>, std::string_view what) override {
    fail("cannot send {} to rank {}: this run has one rank (start it with mpirun -np N)", what,
         to);
  }
  void receive(int32_t from, std::span<std::byte>, std::string_view what) override {
    fail("cannot receive {} from rank {}: this run has one rank (start it with mpirun -np N)",
         what, from);
  }
  std::unique_ptr<PendingTransfer> send_later(int32_t to, std::span<const std::byte> bytes,
                                              std::string_view what) override {
    send(to, bytes, what);  // fails
    return nullptr;
  }
  std::unique_ptr<PendingTransfer> receive_later(int32_t from, std::span<std::byte> bytes,
                                                 std::string_view what) override {
    receive(from, bytes, what);  // fails
    return nullptr;
  }
  void broadcast(int32_t root, std::span<std::byte>, std::string_view what) override {
    if (root != 0) fail("cannot broadcast {} from rank {}: this run has one rank", what, root);
  }
  void all_gather(std::span<const std::byte> mine, std::span<std::byte> all,
                  std::string_view what) override {
    if (all.size() != mine.size())
      fail("gathering {}: {} bytes for one rank's {}", what, all.size(), mine.size());
    if (!mine.empty()) std::memcpy(all.data(), mine.data(), mine.size());
  }
  void all_to_all(std::span<const std::byte> out, std::span<const size_t> out_counts,
                  std::span<std::byte> in, std::span<const size_t> in_counts,
                  std::string_view what) override {
    if (out_counts.size() != 1 || in_counts.size() != 1 || out_counts[0] != in_counts[0] ||
        out.size() < out_counts[0] || in.size() < in_counts[0])
      fail("exchanging {}: the counts do not describe one rank's buffers", what);
    if (out_counts[0] > 0) std::memcpy(in.data(), out.data(), out_counts[0]);
  }
  void abort_run(std::string_view) override {}

 private:
  double timeout_s_ = 60;
};

}  // namespace

int32_t launched_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* value = std::getenv(name); value && std::atoi(value) > 1)
      return std::atoi(value);
  return 1;
}

int32_t launched_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* value = std::getenv(name)) return std::atoi(value);
  return 0;
}

namespace {
std::atomic<bool> waits_interrupted{false};
}  // namespace

void interrupt_rank_waits() {
  waits_interrupted.store(true);
}
bool rank_waits_interrupted() {
  return waits_interrupted.load(std::memory_order_relaxed);
}

bool transport_has_mpi() {
#if TANDEM_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Transport> open_transport(const TransportOptions& options) {
  if (!(options.timeout_s > 0)) fail("the transport's timeout must be positive (got {} s)", options.timeout_s);
#if TANDEM_HAVE_MPI
  if (std::unique_ptr<Transport> mpi = open_mpi_transport(options)) return mpi;
#else
  if (launched_ranks() > 1)
    fail(
        "this tandem was built without MPI, so its {} ranks would each run alone: install Open "
        "MPI (libopenmpi-dev) and build again, or run it without mpirun",
        launched_ranks());
#endif
  auto single = std::make_unique<SingleProcess>();
  single->set_timeout(options.timeout_s);
  return single;
}

void check_same_on_every_rank(Transport& transport, uint64_t value, std::string_view what,
                              std::string_view fix) {
  const int32_t n = transport.n_ranks();
  const std::vector<uint64_t> all = gather_from_every_rank(transport, value, what);
  std::string differing;
  for (int32_t r = 1; r < n; ++r)
    if (all[size_t(r)] != all[0]) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
  if (!differing.empty())
    fail("{} differs between rank 0 and rank(s) {}: {}", what, differing, fix);
}

}  // namespace tandem
