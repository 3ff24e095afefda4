// The transport over MPI (built when CMake finds MPI): nonblocking calls polled against a
// deadline, so a peer that never answers is an error naming it, not a hang.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/transport.h"

namespace tandem {
namespace {

int checked_int(size_t n, std::string_view what) {
  if (n > size_t(INT_MAX)) fail("{}: {} bytes is more than one MPI message carries", what, n);
  return int(n);
}

class MpiTransport : public Transport {
 public:
  MpiTransport(double timeout_s, bool owns_mpi) : timeout_s_(timeout_s), owns_mpi_(owns_mpi) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // Errors come back as codes (turned into tandem::Error) instead of ending the process.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    library_ = std::string(version, size_t(length));
    library_ = library_.substr(0, library_.find_first_of(",\n"));
  }
  // MPI is finalized by whoever initialized it (a cancelled receive leaves nothing pending; a
  // collective that timed out has ended the run, and after a send that timed out the caller ends
  // it before this: Engine does).
  ~MpiTransport() override {
    if (owns_mpi_) MPI_Finalize();
  }

  int32_t rank() const override { return rank_; }
  int32_t n_ranks() const override { return size_; }
  std::string describe() const override {
    return fmt::format("MPI ({}), {} ranks", library_, size_);
  }
  void set_timeout(double seconds) override {
    if (!(seconds > 0)) fail("the transport's timeout must be positive (got {} s)", seconds);
    timeout_s_ = seconds;
  }
  double timeout_s() const override { return timeout_s_; }

  void send(int32_t to, std::span<const std::byte> bytes, std::string_view what) override {
    send_later(to, bytes, what)->wait();
  }
  void receive(int32_t from, std::span<std::byte> bytes, std::string_view what) override {
    receive_later(from, bytes, what)->wait();
  }

  std::unique_ptr<PendingTransfer> send_later(int32_t to, std::span<const std::byte> bytes,
                                              std::string_view what) override {
    check_peer(to, what);
    MPI_Request request;
    check(MPI_Isend(bytes.data(), checked_int(bytes.size(), what), MPI_BYTE, to, kTag,
                    MPI_COMM_WORLD, &request),
          what);
    ++traffic_.messages;
    traffic_.bytes += bytes.size();
    return std::make_unique<Pending>(*this, request, fmt::format("sending {} to rank {}", what, to),
                                     Pending::kSend);
  }

  std::unique_ptr<PendingTransfer> receive_later(int32_t from, std::span<std::byte> bytes,
                                                 std::string_view what) override {
    check_peer(from, what);
    MPI_Request request;
    check(MPI_Irecv(bytes.data(), checked_int(bytes.size(), what), MPI_BYTE, from, kTag,
                    MPI_COMM_WORLD, &request),
          what);
    return std::make_unique<Pending>(
        *this, request, fmt::format("receiving {} from rank {}", what, from), bytes.size());
  }

  void broadcast(int32_t root, std::span<std::byte> bytes, std::string_view what) override {
    if (root < 0 || root >= size_)
      fail("rank {}: {} comes from rank {}, not one of the {}", rank_, what, root, size_);
    const TimeTransfer timed(traffic_);
    MPI_Request request;
    check(MPI_Ibcast(bytes.data(), checked_int(bytes.size(), what), MPI_BYTE, root,
                     MPI_COMM_WORLD, &request),
          what);
    wait(request, fmt::format("broadcasting {} from rank {}", what, root), Timeout::EndsTheRun);
  }

  void all_gather(std::span<const std::byte> mine, std::span<std::byte> all,
                  std::string_view what) override {
    if (all.size() != mine.size() * size_t(size_))
      fail("gathering {}: {} bytes for {} ranks of {}", what, all.size(), size_, mine.size());
    const TimeTransfer timed(traffic_);
    MPI_Request request;
    const int n = checked_int(mine.size(), what);
    check(MPI_Iallgather(mine.data(), n, MPI_BYTE, all.data(), n, MPI_BYTE, MPI_COMM_WORLD,
                         &request),
          what);
    wait(request, fmt::format("gathering {} from every rank", what), Timeout::EndsTheRun);
  }

  void all_to_all(std::span<const std::byte> out, std::span<const size_t> out_counts,
                  std::span<std::byte> in, std::span<const size_t> in_counts,
                  std::string_view what) override {
    if (out_counts.size() != size_t(size_) || in_counts.size() != size_t(size_))
      fail("exchanging {}: counts for {} and {} ranks, not {}", what, out_counts.size(),
           in_counts.size(), size_);
    const size_t n = size_t(size_);
    std::vector<int> send_counts(n), send_at(n), recv_counts(n), recv_at(n);
    size_t send_total = 0, recv_total = 0;
    for (size_t r = 0; r < n; ++r) {
      send_counts[r] = checked_int(out_counts[r], what), send_at[r] = checked_int(send_total, what);
      recv_counts[r] = checked_int(in_counts[r], what), recv_at[r] = checked_int(recv_total, what);
      send_total += out_counts[r], recv_total += in_counts[r];
    }
    if (send_total > out.size() || recv_total > in.size())
      fail("exchanging {}: the counts add up to more than the buffers hold", what);
    const TimeTransfer timed(traffic_);
    MPI_Request request;
    check(MPI_Ialltoallv(out.data(), send_counts.data(), send_at.data(), MPI_BYTE, in.data(),
                         recv_counts.data(), recv_at.data(), MPI_BYTE, MPI_COMM_WORLD, &request),
          what);
    wait(request, fmt::format("exchanging {} with every rank", what), Timeout::EndsTheRun);
  }

  void abort_run(std::string_view why) override {
    std::fprintf(stderr, "tandem: rank %d ends the run: %.*s\n", rank_, int(why.size()),
                 why.data());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

 private:
  static constexpr int kTag = 17;

  // A send or receive begun by send_later / receive_later.
  class Pending : public PendingTransfer {
   public:
    static constexpr size_t kSend = SIZE_MAX;  // `receiving` of a send
    Pending(MpiTransport& transport, MPI_Request request, std::string doing, size_t receiving)
        : transport_(transport),
          request_(request),
          doing_(std::move(doing)),
          receiving_(receiving) {}
    // Dropped unfinished (its step failed): a receive is cancelled if it can be; a send, or a
    // receive already under way, stays pending, as after a timeout.
    ~Pending() override {
      if (!done_ && receiving_ != kSend) transport_.cancel_receive(request_);
    }
    void wait() override {
      if (done_) return;
      done_ = true;  // once: a wait that fails has cancelled the receive, or left it pending
      const TimeTransfer timed(transport_.traffic_);
      const MPI_Status status = transport_.wait(
          request_, doing_, receiving_ == kSend ? Timeout::LeavesItPending : Timeout::Throws);
      if (receiving_ == kSend) return;
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      if (size_t(count) != receiving_)
        fail("rank {}: {} came as {} bytes, not {}: the ranks disagree on the plan",
             transport_.rank_, doing_, count, receiving_);
    }

   private:
    MpiTransport& transport_;
    MPI_Request request_;
    std::string doing_;
    size_t receiving_;
    bool done_ = false;
  };

  // Adds the time of one transfer to Traffic::transfer_s, however it ends. Collectives count too:
  // bench's gathers of every rank's traffic are time no rank computes.
  struct TimeTransfer {
    explicit TimeTransfer(Traffic& traffic) : traffic(traffic) {}
    ~TimeTransfer() {
      traffic.transfer_s +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    Traffic& traffic;
    const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  };

  void check_peer(int32_t peer, std::string_view what) const {
    if (peer < 0 || peer >= size_ || peer == rank_)
      fail("rank {}: {} names rank {}, not another rank of the {}", rank_, what, peer, size_);
  }

  void check(int code, std::string_view what) const {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    fail("rank {}: MPI failed moving {}: {}", rank_, what, std::string_view(text, size_t(length)));
  }

  // What a wait past its deadline does. A receive is cancelled where it can be (one not yet
  // matched to a message) and throws; one that cannot be stays pending, its buffer alive until
  // the run ends. A send cannot be taken back either: it is left pending and the error thrown, the
  // caller keeping its bytes until the run ends (core/transport.h), so that a server tells its
  // clients first. A collective ends the run there, on every rank, with the message.
  enum class Timeout { Throws, LeavesItPending, EndsTheRun };

  // Polls until the request completes or the deadline passes: spinning first (a transfer on the
  // step's critical path usually lands within microseconds), then yielding the core for as long
  // as a step may take, then sleeping in short naps (an idle wait). Napping from the start cost a
  // nap per message: measured on small-v3-Q4_K_M, 2 ranks on 2 cores, decode 1511 -> 2558
  // tokens/s (pipeline) and 691 -> 3312 (experts spread) by yielding instead; one process: 3168.
  MPI_Status wait(MPI_Request& request, const std::string& doing, Timeout on_timeout) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::duration<double>(timeout_s_);
    MPI_Status status{};
    for (int polls = 0;; ++polls) {
      int done = 0;
      check(MPI_Test(&request, &done, &status), doing);
      if (done) return status;
      const bool interrupted = rank_waits_interrupted();
      if (interrupted || std::chrono::steady_clock::now() > deadline) {
        const std::string why =
            interrupted
                ? fmt::format(
                      "rank {}: {} was interrupted: the run is stopping (a signal; under "
                      "mpirun, often another rank's end)",
                      rank_, doing)
                : fmt::format(
                      "rank {}: {} got no answer in {} s: that rank died, hangs, or its link "
                      "dropped; the run cannot go on",
                      rank_, doing, timeout_s_);
        if (on_timeout == Timeout::EndsTheRun) abort_run(why);
        if (on_timeout == Timeout::LeavesItPending) fail("{}", why);
        if (std::optional<MPI_Status> arrived = cancel_receive(request)) return *arrived;
        fail("{}", why);
      }
      // Yielding lets a peer oversubscribed on the same cores run.
      if (polls < 100) continue;
      if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(50))
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // Cancels a receive; its status if it completed after all. A receive already matched to a
  // message in flight cannot be cancelled, and waiting for it hangs when its sender died (seen: a
  // served stream cut by mpirun's SIGKILL while this rank sat in MPI_Wait). So the cancel gets a
  // moment; past it the receive stays pending, as a timed-out send does.
  std::optional<MPI_Status> cancel_receive(MPI_Request& request) {
    MPI_Status status{};
    if (request == MPI_REQUEST_NULL) return std::nullopt;
    MPI_Cancel(&request);
    // 50 ms and at least a few tests: a rank descheduled past the deadline (ranks sharing cores)
    // still sees a cancel that MPI completed at once.
    const auto given_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    for (int tests = 0; tests < 100 || std::chrono::steady_clock::now() < given_up; ++tests) {
      int cancel_done = 0;
      if (MPI_Test(&request, &cancel_done, &status) != MPI_SUCCESS) return std::nullopt;
      if (!cancel_done) {
        std::this_thread::yield();
        continue;
      }
      int cancelled = 0;
      MPI_Test_cancelled(&status, &cancelled);
      if (!cancelled) return status;  // it arrived after all
      return std::nullopt;
    }
    return std::nullopt;
  }

  double timeout_s_;
  bool owns_mpi_;  // initialized MPI (and so finalizes it)
  int rank_ = 0, size_ = 1;
  std::string library_;
};

}  // namespace

std::unique_ptr<Transport> open_mpi_transport(const TransportOptions& options) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) fail("MPI has been finalized: open the transport once per process");
  static bool opened = false;  // once per process: MPI cannot start again once finalized
  if (opened) fail("the transport is opened once per process");
  if (!initialized) {
    if (launched_ranks() <= 1) return nullptr;  // a plain start: MPI stays uninitialized
    // Transfers may come from any one thread at a time (the scheduler's loop, a test's main).
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (provided < MPI_THREAD_SERIALIZED)
      fail("the MPI library gives thread level {}; tandem needs MPI_THREAD_SERIALIZED", provided);
  }
  opened = true;
  return std::make_unique<MpiTransport>(options.timeout_s, !initialized);
}

}  // namespace tandem
