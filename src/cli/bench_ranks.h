#pragma once
// `tandem bench` over several ranks (mpirun -np N): what crossing ranks costs a decode step. The
// same decode runs over the ranks and in rank 0 alone (repetitions alternating); the difference
// per step is set beside the cost model's transfer time for the messages and bytes the step sent,
// over the link between rank 0 and rank 1 as a ping-pong measures it.
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
  double messages_per_step = 0, bytes_per_step = 0;
  Engine::RankLink link;
  double measured_s_per_step = 0;   // step over the ranks less the step alone
  double predicted_s_per_step = 0;  // the cost model's transfer time of the step's messages
};

// On rank 0 of `engine` (spread over ranks, loaded with `options`): `n_gen` decode steps per
// repetition each way.
RankBench bench_ranks(Engine& engine, const EngineOptions& options, int64_t n_gen, int repetitions);

std::string format_rank_bench(const RankBench& r);
nlohmann::ordered_json rank_bench_json(const RankBench& r);

}  // namespace tandem::cli
