#pragma once
// The interface that moves host buffers between the ranks of one run spread over machines
// (DESIGN.md "Several machines"): activations from one pipeline stage to the next, routed tokens
// to the machines that hold their experts, each step's inputs from rank 0 to the others. It lives
// here so that the executor (model/) can move its activations without knowing how; MPI carries
// them (runtime/transport.h opens it), and there is no network code of tandem's own. Buffers in
// GPU memory can go beside it, device to device (NCCL): core/backend.h's RankChannel.
//
// Every wait has a deadline: a peer that does not answer in time (it died, its link dropped, it
// is stuck) makes the call throw tandem::Error naming the peer and what was being moved, never
// hang. After such an error the run cannot go on; `abort_run` ends every rank. A send that timed
// out, or a receive whose message had begun to arrive, stays pending inside MPI: its buffer must
// stay alive until abort_run (a collective that times out ends the run at once).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace tandem {

// A send or receive started now and finished by wait(): the message may land while this rank
// computes, and neither end waits for the other to reach its call. Its buffer must stay alive and
// unchanged until wait() returns. wait() has the transport's deadline from when it is called and
// fails as the blocking call would; a transfer dropped without wait() is cancelled where MPI can
// (a receive not yet matched), else left pending until the run ends (its buffer kept alive).
class PendingTransfer {
 public:
  virtual ~PendingTransfer() = default;
  virtual void wait() = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int32_t rank() const = 0;
  virtual int32_t n_ranks() const = 0;
  // "MPI (Open MPI v4.1.4), 3 ranks" or "single process".
  virtual std::string describe() const = 0;
  // The longest any call waits for a peer from now on (a load may allow more than a step).
  virtual void set_timeout(double seconds) = 0;
  virtual double timeout_s() const = 0;

  // Point to point; `what` names the transfer in errors ("layer 12's input, step 40").
  virtual void send(int32_t to, std::span<const std::byte> bytes, std::string_view what) = 0;
  // `bytes` must be exactly the size the sender sent.
  virtual void receive(int32_t from, std::span<std::byte> bytes, std::string_view what) = 0;
  // Both started now and finished by PendingTransfer::wait() (null never). Messages between two
  // ranks match in the order they were started, blocking or not, as MPI's do.
  virtual std::unique_ptr<PendingTransfer> send_later(int32_t to, std::span<const std::byte> bytes,
                                                      std::string_view what) = 0;
  virtual std::unique_ptr<PendingTransfer> receive_later(int32_t from, std::span<std::byte> bytes,
                                                         std::string_view what) = 0;
  // `root`'s bytes into every rank's `bytes` (the same size on every rank).
  virtual void broadcast(int32_t root, std::span<std::byte> bytes, std::string_view what) = 0;
  // Every rank's `mine` (the same size everywhere) into `all`, in rank order.
  virtual void all_gather(std::span<const std::byte> mine, std::span<std::byte> all,
                          std::string_view what) = 0;
  // Rank r's `out_counts[q]` bytes (consecutive in `out`, in rank order) go to rank q, which
  // receives them into `in` at its `in_counts[r]` slot (in_counts[r] must equal what r sends).
  virtual void all_to_all(std::span<const std::byte> out, std::span<const size_t> out_counts,
                          std::span<std::byte> in, std::span<const size_t> in_counts,
                          std::string_view what) = 0;

  // Ends every rank of the run after printing `why` (a rank's failure the others cannot recover
  // from); returns only in a single-process run, where the caller's error ends the process.
  virtual void abort_run(std::string_view why) = 0;

  // What this rank's transfers have cost so far: the point-to-point messages it sent and their
  // bytes, and the seconds it spent in every transfer call (waiting for peers included). Bench
  // sets these beside the time each rank computes to find what crossing ranks costs a step.
  struct Traffic {
    uint64_t messages = 0, bytes = 0;
    double transfer_s = 0;
  };
  const Traffic& traffic() const { return traffic_; }
  // Back to an earlier count: transfers that were not the run's (a probe of the link).
  void traffic_reset(const Traffic& to) { traffic_ = to; }
  // Counts a transfer that went beside this transport (a GPU buffer over NCCL: core/backend.h's
  // RankChannel) as if it had gone through it.
  void count_transfer(bool sent, uint64_t bytes, double seconds) {
    traffic_.messages += sent;
    traffic_.bytes += sent ? bytes : 0;
    traffic_.transfer_s += seconds;
  }

 protected:
  Traffic traffic_;
};

}  // namespace tandem
