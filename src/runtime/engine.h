#pragma once
// The public entry of the engine: load a model file onto the devices and evaluate tokens.
// The CPU, with GPUs (CUDA builds) or simulated devices placed by the planner; every
// architecture of model/model.h. Sessions (runtime/session.h) generate text on top of it.
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/backend.h"
#include "core/transport.h"
#include "gguf/gguf_file.h"
#include "model/model.h"
#include "plan/placement.h"
#include "runtime/prefix_cache.h"
#include "runtime/rank_spread.h"

namespace tandem {

class Backend;
class KvCache;
class Tokenizer;

struct EngineOptions {
  std::string model_path;
  int n_threads = 0;     // 0: physical cores
  int64_t n_ctx = 0;     // 0: the model's training context, capped by free memory
  int64_t n_seq = 1;     // sequences that can be in flight at once
  bool verbose = false;  // load details on stderr
  // "auto" (the CPU and every GPU found), "cpu", "cuda:0,cuda:1", simulated devices
  // "sim:2x200MiB" (see device_setup.h).
  std::string devices = "auto";
  bool graphs = true;           // decode steps replayed as graphs where the plan allows
  // Prompt chunks of at least this many tokens stream the experts held in RAM to their layer's
  // GPU (DevicePlan::stream_experts_min_tokens): -1 the cost model's choice, 0 never.
  int64_t stream_experts = -1;
  PrecisionPolicy precision = PrecisionPolicy::FfnInt8;  // which products take 8-bit activations
  std::string rules;            // rule file pinning weight groups to devices (with --devices)
  std::string profile;          // routing profile: most-used experts placed first (with --devices)
  bool mlock = false;           // lock the model file in RAM so it is never paged out
  bool repack = false;          // load the model's repacked copy (model/repack.h), made if need be
  bool repack_in_memory = false;  // the same copy made in RAM at every load, no file written
  bool pin_threads = true;      // each CPU thread on its own physical core (thread_pool.h)
  // The KV cache's keys and values: F32, or BF16 (half the memory; the CPU backend only;
  // KvLayerView). One type for both (an MLA cache row is key and value at once): the engine
  // refuses two.
  DType cache_type_k = DType::F32, cache_type_v = DType::F32;
  // Under `mpirun -np N` (N > 1): how the model is divided between the ranks (rank_spread.h:
  // "plan", "pipeline", "experts", "mixed"; empty: plan where the ranks have devices to plan
  // for, pipeline on CPUs alone), and the longest a rank waits for another mid-step before the
  // run ends.
  std::string spread;
  double rank_timeout_s = 300;
  // Under `mpirun`: a cluster file (plan/cluster.h) to plan over instead of N machines like this
  // one: a rank per machine it lists, in order, each with the devices listed for its machine.
  std::string cluster;
  bool alone = false;  // this process alone even under mpirun (bench's one-process baseline)
  // When a step fails over several ranks, rank 0 ends the run on every rank after this long;
  // meanwhile its evaluate calls fail at once with the error (a server tells its clients). 0:
  // at once.
  double rank_failure_grace_s = 0;
};

class Engine {
 public:
  explicit Engine(const EngineOptions& options);
  // Rank 0 of a run over several ranks tells the others to stop following.
  ~Engine();

  // A run over several ranks (mpirun): rank 0 tokenizes, samples and calls evaluate; every other
  // rank follows its steps. The rank's number and the ranks in the run (0 and 1 in one process).
  int32_t rank() const;
  int32_t n_ranks() const;
  bool follows() const { return rank() != 0; }
  // How the model is divided between the ranks (the default resolved; Pipeline in one process).
  Spread rank_spread() const { return spread_; }
  // Over ranks: which rank runs each part (empty in one process).
  const RankPlan& rank_plan() const { return rank_plan_; }
  // On a following rank: runs rank 0's steps until its Engine ends. An error here ends the run on
  // every rank with its message.
  void follow();

  // Rank 0 of a run over several ranks, for bench: the link to rank 1 measured by ping-pong (a
  // small message's one-way time, and the rate of large ones), and each rank's transfers so far
  // with its own clock, so that bench can tell the time a rank computed from the time it spent in
  // transfers. The other ranks take part from follow().
  struct RankLink {
    double latency_s = 0, bytes_per_s = 0;
  };
  RankLink measure_rank_link();
  struct RankTraffic {
    Transport::Traffic traffic;    // its sends (counted) and its time in transfers
    Transport::Traffic announced;  // of them, rank 0's announcements of what comes next
    double clock_s = 0;            // this rank's steady clock (only its differences mean much)
  };
  std::vector<RankTraffic> rank_traffic();  // one a rank, in rank order

  const gguf::GgufFile& file() const { return *file_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ModelInfo& info() const;
  int64_t n_vocab() const;
  int64_t n_ctx() const;
  uint64_t kv_cache_bytes() const;
  uint64_t weight_bytes() const;
  int n_threads() const { return n_threads_; }
  // The devices the model runs on: "cpu", then "cuda:0" or "sim:0" ... when the plan uses them.
  std::vector<std::string> device_names() const;
  // The planner's placement the model was loaded with; null for a CPU-only run (no plan).
  const plan::Placement* placement() const { return placement_ ? &*placement_ : nullptr; }
  // Prompt chunks of at least this many tokens stream the experts in RAM to their layer's GPU
  // (the plan's choice or --stream-experts); 0: never.
  int64_t stream_experts_min_tokens() const { return stream_experts_min_tokens_; }
  double load_seconds() const { return load_seconds_; }
  // Expert choices counted since load, as a routing profile for `plan` and `--profile`. Over
  // ranks (rank 0 asks; a collective), every rank's layers.
  plan::RoutingProfile routing_profile();
  // Expert choices since load, summed by the device that holds each expert: ("cpu", n), ...; over
  // ranks every rank's devices, named as a plan over machines names them ("node1:cuda:0"), but
  // only rank 0's once a step has failed over the ranks (the run is ending).
  // Not safe to call while another thread evaluates.
  std::vector<std::pair<std::string, uint64_t>> routing_counts_by_device();
  // The parts of the model files that loading and evaluating so far have needed (see
  // Model::touched_file_ranges): what a cold start must read from disk.
  std::vector<gguf::FileRange> touched_file_ranges() const;

  // Evaluates `tokens` of sequence `seq` at positions start, start+1, ...; the cache keeps them
  // (in steps of at most max_step_tokens() when a layer's cache is a window's ring). Writes the
  // logits of every token (all_logits) or of the last one into `logits` ([rows, n_vocab]).
  // Throws tandem::Error if the tokens would pass the context.
  void evaluate(std::span<const int32_t> tokens, int32_t start, int32_t seq, bool all_logits,
                std::vector<float>& logits);

  // One forward pass over tokens of several sequences (a batching server's step): token i is at
  // position positions[i] of sequence seq_ids[i]. Writes the logits of the tokens listed in
  // `logit_rows`, in that order ([rows, n_vocab]). `kernels` as in core/backend.h: prompt steps
  // Tiled and decode steps PerToken make each sequence's logits independent of the batch.
  // Throws tandem::Error for a position outside the context, a sequence out of range, or more
  // than max_step_tokens() tokens of one sequence in a step of a model with window layers.
  void evaluate_batch(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                      std::span<const int32_t> seq_ids, std::span<const int32_t> logit_rows,
                      KernelChoice kernels, std::vector<float>& logits);
  // evaluate_batch in two calls, so that steps of different sequences overlap over ranks. Over
  // ranks in a pipeline whose first stage is rank 0's (steps_in_flight() > 1), start_batch returns
  // once rank 0's part of the step is done, and rank 0 can start the next step (of other
  // sequences) while later ranks compute this one; finish_batch waits for its logits. Elsewhere
  // start_batch runs the whole step. Steps finish in the order they started; each token's bits
  // are what evaluate_batch gives (batch invariance). The KV work below may go between them.
  uint64_t start_batch(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                       std::span<const int32_t> seq_ids, std::span<const int32_t> logit_rows,
                       KernelChoice kernels);
  void finish_batch(uint64_t step, std::vector<float>& logits);
  // How many steps are worth having in flight: the ranks a step passes through in turn, where
  // rank 0's share comes first (rank_spread.h overlapping_stages); 1 in one process.
  int32_t steps_in_flight() const { return steps_in_flight_; }
  int64_t n_seq() const;
  // The most tokens of one sequence one forward pass stores (sizes the rings of window layers).
  static constexpr int64_t kMaxStepTokens = 512;
  // The furthest back a sequence holding `length` positions may be cut to and continued (0 but
  // for models with sliding-window layers, whose caches keep only their last rows).
  int64_t earliest_rewind(int64_t length) const;
  // The KV cache itself.
  KvCache& kv_cache() { return *cache_; }

  // A server's work on the KV cache between steps, done on every rank of a run over several ranks
  // (rank 0 announces each call): the prefix cache (prefix_cache.h; `budget_bytes` 0: none), and
  // copying a prompt's rows to the other choices of a request (KvCache::copy_sequence).
  void enable_prefix_cache(uint64_t budget_bytes);
  bool has_prefix_cache() const { return prefix_cache_ != nullptr; }
  int64_t restore_prefix(std::span<const int32_t> tokens, int64_t limit, int32_t seq);
  void store_prefix(std::span<const int32_t> tokens, int32_t seq);
  PrefixCache::Stats prefix_cache_stats() const;
  void copy_sequence(int32_t from, int32_t to, int64_t length);

 private:
  // The constructor's work once the transport is open.
  void use_repacked_copy(bool in_memory);
  void load(const EngineOptions& options, Spread spread,
            std::chrono::steady_clock::time_point start);
  // Rank 0: tells the following ranks what comes next (engine.cpp's FollowerOp).
  void announce(int32_t op, std::span<const int32_t> body = {});
  // announced_ and announced_body_ to every other rank, counted in announced_traffic_.
  void send_announcement(std::string_view what);
  // Both ends of measure_rank_link's ping-pong and rank_traffic's gathering.
  RankLink ping_pong();
  std::vector<RankTraffic> gather_traffic();
  // Both ends of routing_profile and routing_counts_by_device over ranks: every rank's counts
  // merged, and every rank's devices' totals.
  struct RoutingTally {
    std::vector<std::vector<uint64_t>> counts;
    std::vector<std::pair<std::string, uint64_t>> by_device;
  };
  RoutingTally gather_routing();
  // `counts` summed by this rank's backends holding each expert, named with `prefix`.
  std::vector<std::pair<std::string, uint64_t>> choices_by_device(
      const std::vector<std::vector<uint64_t>>& counts, const std::string& prefix) const;
  // Rank 0: sends a step's inputs to the following ranks.
  void announce_step(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                     std::span<const int32_t> seq_ids, std::span<const int32_t> logit_rows,
                     KernelChoice kernels);

  std::unique_ptr<Transport> transport_;  // null in a run of one process
  double rank_timeout_s_ = 300;           // EngineOptions::rank_timeout_s
  double rank_failure_grace_s_ = 0;       // EngineOptions::rank_failure_grace_s
  std::string rank_failure_;              // the step that failed over the ranks, once one has
  uint64_t steps_ = 0;                    // forward passes so far (named in errors)
  Spread spread_ = Spread::Pipeline;      // over ranks: how the model is divided
  RankPlan rank_plan_;                    // over ranks: which rank runs each part
  Transport::Traffic announced_traffic_;  // rank 0: what announce() has sent
  std::unique_ptr<AlignedBuffer> repacked_memory_;  // --repack-in-memory: the image file_ reads
  std::unique_ptr<gguf::GgufFile> file_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::unique_ptr<Backend>> backends_;  // [0] = cpu
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvCache> cache_;
  int n_threads_ = 1;
  double load_seconds_ = 0;
  std::vector<int32_t> positions_, seq_ids_, logit_rows_;
  // Steps started and not yet finished, oldest first, each with its logits' buffer and (over
  // ranks, on rank 0) their receive from the head's rank; a spare buffer for the next one.
  struct StepInFlight {
    uint64_t id = 0;
    std::vector<float> logits;
    std::unique_ptr<PendingTransfer> arriving;
  };
  std::deque<StepInFlight> in_flight_;
  // Steps that failed with their logits' receive unfinished: kept, buffers and all, until the run
  // ends (MPI may still write into them; core/transport.h).
  std::vector<StepInFlight> failed_steps_;
  std::vector<float> spare_logits_;
  uint64_t started_ = 0;
  int32_t steps_in_flight_ = 1;
  // Runs `part` of a step over ranks; a failure ends the run on every rank (engine.cpp).
  void over_ranks(const std::function<void()>& part);
  std::unique_ptr<PrefixCache> prefix_cache_;
  // A step or other work as rank 0 announces it to the following ranks: this header, then its
  // ints (a step: tokens, positions, sequence ids and logit rows). The last one is kept here, not
  // on the stack: a send that timed out may read it until the run ends.
  struct StepHeader {
    int32_t op = 0;  // engine.cpp's FollowerOp
    int32_t n_tokens = 0, n_rows = 0;
    int32_t kernels = 0;
  } announced_;
  std::vector<int32_t> announced_body_;
  std::optional<plan::Placement> placement_;
  int64_t stream_experts_min_tokens_ = 0;
};

}  // namespace tandem
