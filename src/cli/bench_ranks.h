#pragma once
// `tandem bench` over several ranks (mpirun -np N): what crossing ranks costs a decode step.
// Each rank counts the time it spends in transfers (sending, receiving, waiting for a peer); the
// rest of its time it computes. Where the ranks take turns (a pipeline), the time of a step in
// which no rank computes is what the transfers cost it: that is set beside the cost model's time
// for the step's transfers over the link between rank 0 and rank 1, as a ping-pong measures it.
// Where ranks compute experts at once the transfers overlap that compute and only the cost
// model's figure is printed. The same decode also runs in rank 0 alone (repetitions
// alternating), for the speed over the ranks against one process. With --parallel, several
// sequences decode at once in one step, and in overlapping steps, for what the overlap gives.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/engine.h"

namespace tandem::cli {

struct RankBench {
  int32_t n_ranks = 1;
  std::string spread;
  double decode_tokens_per_s = 0;        // over the ranks
  double decode_alone_tokens_per_s = 0;  // rank 0 alone, the same decode
  // Per step: the step's own transfers (activations, routing, logits), and rank 0's
  // announcements of each step, which the other ranks receive while rank 0 computes.
  double messages_per_step = 0, bytes_per_step = 0;
  double announced_messages_per_step = 0, announced_bytes_per_step = 0;
  double announcing_s_per_step = 0;  // rank 0's time sending them
  Engine::RankLink link;
  double measured_s_per_step = 0;   // the step's time in which no rank computed, less announcing
  double predicted_s_per_step = 0;  // the cost model's time of the step's transfers on that link
  bool comparable = false;          // the ranks take turns: the measure holds
  // --parallel N: N sequences decoding at once, in one step each time, and in as many overlapping
  // steps as Engine::steps_in_flight() (1: the plan does not let steps overlap).
  int32_t parallel = 1, overlapping_steps = 1;
  double parallel_one_step_tokens_per_s = 0, parallel_overlapped_tokens_per_s = 0;
};

// On rank 0 of `engine` (spread over ranks, loaded with `options`): `n_gen` decode steps per
// repetition each way; with `parallel` > 1 (engine.n_seq() as many), that many sequences too.
RankBench bench_ranks(Engine& engine, const EngineOptions& options, int64_t n_gen, int repetitions,
                      int32_t parallel);

std::string format_rank_bench(const RankBench& r);
nlohmann::ordered_json rank_bench_json(const RankBench& r);

}  // namespace tandem::cli
