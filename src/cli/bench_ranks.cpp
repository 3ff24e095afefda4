#include "cli/bench_ranks.h"

#include <fmt/format.h>

#include <chrono>
#include <vector>

#include "core/error.h"
#include "plan/cost_model.h"

namespace tandem::cli {
namespace {

// Seconds per step of `n_gen` one-token steps of sequence 0 from position 0.
double decode_seconds_per_step(Engine& engine, int64_t n_gen) {
  std::vector<float> logits;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n_gen; ++i) {
    const int32_t token = int32_t(3 + (i * 37) % 97);  // ids 3..99 exist in every vocabulary
    engine.evaluate(std::span<const int32_t>(&token, 1), int32_t(i), 0, false, logits);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
         double(n_gen);
}

}  // namespace

RankBench bench_ranks(Engine& engine, const EngineOptions& options, int64_t n_gen,
                      int repetitions) {
  TANDEM_CHECK(engine.n_ranks() > 1 && !engine.follows());
  if (n_gen < 1) fail("bench over several ranks measures decode steps: give --n-gen 1 or more");
  RankBench r{.n_ranks = engine.n_ranks(),
              .spread = options.spread.empty() ? "pipeline" : options.spread};
  EngineOptions alone_options = options;
  alone_options.alone = true;
  alone_options.spread.clear();
  Engine alone(alone_options);
  decode_seconds_per_step(engine, 4);  // warm-up, both ways
  decode_seconds_per_step(alone, 4);
  // Alternating, so that a slow spell of a shared machine falls on both alike.
  double spread_s = 0, alone_s = 0;
  Transport::Sent sent;
  for (int rep = 0; rep < repetitions; ++rep) {
    const Transport::Sent before = engine.rank_traffic();  // a gather: nothing point to point
    spread_s += decode_seconds_per_step(engine, n_gen);
    const Transport::Sent after = engine.rank_traffic();
    sent.messages += after.messages - before.messages, sent.bytes += after.bytes - before.bytes;
    alone_s += decode_seconds_per_step(alone, n_gen);
  }
  const double steps = double(n_gen) * repetitions;
  spread_s /= repetitions, alone_s /= repetitions;
  r.decode_tokens_per_s = 1.0 / spread_s;
  r.decode_alone_tokens_per_s = 1.0 / alone_s;
  r.messages_per_step = double(sent.messages) / steps;  // the steps' announcements included
  r.bytes_per_step = double(sent.bytes) / steps;
  r.link = engine.measure_rank_link();
  r.measured_s_per_step = spread_s - alone_s;
  r.predicted_s_per_step = plan::link_seconds(
      {.bandwidth_bytes_per_s = r.link.bytes_per_s, .latency_s = r.link.latency_s},
      r.messages_per_step, r.bytes_per_step);
  return r;
}

std::string format_rank_bench(const RankBench& r) {
  return fmt::format(
      "\nover {} ranks (--spread {}): decode {:.2f} tokens/s, {:.2f} in rank 0 alone (measured, "
      "alternating); each step sent {:.1f} messages, {:.1f} KiB between ranks\n"
      "link rank 0 - rank 1 (measured, ping-pong): {:.1f} us a small message, {:.2f} GB/s\n"
      "transfer cost per decode step: measured {:.1f} us (step over the ranks less the step "
      "alone), predicted {:.1f} us (cost model over that link) = {:.2f}x measured\n",
      r.n_ranks, r.spread, r.decode_tokens_per_s, r.decode_alone_tokens_per_s, r.messages_per_step,
      r.bytes_per_step / 1024, r.link.latency_s * 1e6, r.link.bytes_per_s / 1e9,
      r.measured_s_per_step * 1e6, r.predicted_s_per_step * 1e6,
      r.measured_s_per_step > 0 ? r.predicted_s_per_step / r.measured_s_per_step : 0.0);
}

nlohmann::ordered_json rank_bench_json(const RankBench& r) {
  return {{"n_ranks", r.n_ranks},
          {"spread", r.spread},
          {"decode_tokens_per_s", r.decode_tokens_per_s},
          {"decode_alone_tokens_per_s", r.decode_alone_tokens_per_s},
          {"messages_per_step", r.messages_per_step},
          {"bytes_per_step", r.bytes_per_step},
          {"link_latency_s", r.link.latency_s},
          {"link_bytes_per_s", r.link.bytes_per_s},
          {"measured_transfer_s_per_step", r.measured_s_per_step},
          {"predicted_transfer_s_per_step", r.predicted_s_per_step}};
}

}  // namespace tandem::cli
