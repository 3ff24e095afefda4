#include "cli/bench_ranks.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
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

// Tokens per second of `n_seq` sequences decoding `n_gen` tokens each from position 0, in `lanes`
// groups, each with a step in flight (Engine::start_batch): 1 is one step for all of them at a
// time, finished before the next starts.
double parallel_decode_tokens_per_s(Engine& engine, int32_t n_seq, int64_t n_gen, int32_t lanes) {
  std::vector<std::vector<int32_t>> groups(static_cast<size_t>(lanes));
  for (int32_t s = 0; s < n_seq; ++s) groups[size_t(s * lanes / n_seq)].push_back(s);
  std::deque<uint64_t> in_flight;
  std::vector<float> logits;
  std::vector<int32_t> tokens, positions, rows;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n_gen; ++i)
    for (const std::vector<int32_t>& group : groups) {
      if (in_flight.size() == size_t(lanes)) {
        engine.finish_batch(in_flight.front(), logits);
        in_flight.pop_front();
      }
      tokens.clear(), positions.clear(), rows.clear();
      for (int32_t s : group) {
        tokens.push_back(int32_t(3 + (i * 37 + s * 11) % 97));  // ids 3..99 exist everywhere
        positions.push_back(int32_t(i));
        rows.push_back(int32_t(rows.size()));
      }
      in_flight.push_back(
          engine.start_batch(tokens, positions, group, rows, KernelChoice::PerToken));
    }
  for (; !in_flight.empty(); in_flight.pop_front()) engine.finish_batch(in_flight.front(), logits);
  return double(n_seq) * double(n_gen) /
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// What one stretch of steps between two gathers of every rank's traffic cost: the time in which
// no rank computed (each rank computed for its clock's time less its time in transfers, and the
// stretch's time beyond the sum of those is the rest), and the messages and bytes sent, rank 0's
// announcements apart.
struct Stretch {
  double no_rank_computing_s = 0, announcing_s = 0;
  Transport::Traffic step, announced;
};
Stretch stretch_between(const std::vector<Engine::RankTraffic>& before,
                        const std::vector<Engine::RankTraffic>& after) {
  Stretch s;
  s.no_rank_computing_s = after[0].clock_s - before[0].clock_s;
  for (size_t r = 0; r < after.size(); ++r) {
    const Transport::Traffic &b = before[r].traffic, &a = after[r].traffic;
    s.no_rank_computing_s -= (after[r].clock_s - before[r].clock_s) - (a.transfer_s - b.transfer_s);
    const Transport::Traffic &ab = before[r].announced, &aa = after[r].announced;
    s.announced.messages += aa.messages - ab.messages, s.announced.bytes += aa.bytes - ab.bytes;
    s.announcing_s += aa.transfer_s - ab.transfer_s;
    s.step.messages += (a.messages - b.messages) - (aa.messages - ab.messages);
    s.step.bytes += (a.bytes - b.bytes) - (aa.bytes - ab.bytes);
  }
  return s;
}

// Whether the ranks take turns: no MoE layer's experts on another rank than the layer's (a
// pipeline, as --spread pipeline or a plan of whole layers gives). Only then is the time in which
// no rank computed the transfers' time; ranks that compute experts at once overlap it.
bool ranks_take_turns(const RankPlan& ranks) {
  for (size_t il = 0; il < ranks.layers.size(); ++il)
    for (int32_t r : ranks.experts[il])
      if (r != ranks.layers[il]) return false;
  return true;
}

}  // namespace

RankBench bench_ranks(Engine& engine, const EngineOptions& options, int64_t n_gen, int repetitions,
                      int32_t parallel) {
  TANDEM_CHECK(engine.n_ranks() > 1 && !engine.follows());
  if (n_gen < 1) fail("bench over several ranks measures decode steps: give --n-gen 1 or more");
  RankBench r{.n_ranks = engine.n_ranks(),
              .spread = std::string(spread_name(engine.rank_spread()))};
  EngineOptions alone_options = options;
  alone_options.alone = true;
  alone_options.n_seq = 1;
  alone_options.spread.clear();
  Engine alone(alone_options);
  decode_seconds_per_step(engine, 4);  // warm-up, both ways
  decode_seconds_per_step(alone, 4);
  // Alternating, so that a slow spell of a shared machine falls on both alike.
  double spread_s = 0, alone_s = 0;
  Stretch all;
  for (int rep = 0; rep < repetitions; ++rep) {
    const std::vector<Engine::RankTraffic> before = engine.rank_traffic();  // a gather
    spread_s += decode_seconds_per_step(engine, n_gen);
    const Stretch s = stretch_between(before, engine.rank_traffic());
    all.no_rank_computing_s += s.no_rank_computing_s, all.announcing_s += s.announcing_s;
    all.step.messages += s.step.messages, all.step.bytes += s.step.bytes;
    all.announced.messages += s.announced.messages, all.announced.bytes += s.announced.bytes;
    alone_s += decode_seconds_per_step(alone, n_gen);
  }
  const double steps = double(n_gen) * repetitions;
  spread_s /= repetitions, alone_s /= repetitions;
  r.decode_tokens_per_s = 1.0 / spread_s;
  r.decode_alone_tokens_per_s = 1.0 / alone_s;
  r.messages_per_step = double(all.step.messages) / steps;
  r.bytes_per_step = double(all.step.bytes) / steps;
  r.announced_messages_per_step = double(all.announced.messages) / steps;
  r.announced_bytes_per_step = double(all.announced.bytes) / steps;
  r.announcing_s_per_step = all.announcing_s / steps;
  r.link = engine.measure_rank_link();
  if (parallel > 1) {
    r.parallel = parallel;
    r.overlapping_steps = std::min(engine.steps_in_flight(), parallel);
    parallel_decode_tokens_per_s(engine, parallel, 4, r.overlapping_steps);  // warm-up
    for (int rep = 0; rep < repetitions; ++rep) {  // alternating, as above
      r.parallel_one_step_tokens_per_s += parallel_decode_tokens_per_s(engine, parallel, n_gen, 1);
      if (r.overlapping_steps > 1)
        r.parallel_overlapped_tokens_per_s +=
            parallel_decode_tokens_per_s(engine, parallel, n_gen, r.overlapping_steps);
    }
    r.parallel_one_step_tokens_per_s /= repetitions;
    r.parallel_overlapped_tokens_per_s /= repetitions;
  }
  r.comparable = ranks_take_turns(engine.rank_plan());
  // Rank 0 sends each announcement before it computes (a send of a few bytes, not a wait):
  // counted apart, as the prediction leaves it out.
  r.measured_s_per_step = (all.no_rank_computing_s - all.announcing_s) / steps;
  r.predicted_s_per_step = plan::link_seconds(
      {.bandwidth_bytes_per_s = r.link.bytes_per_s, .latency_s = r.link.latency_s},
      r.messages_per_step, r.bytes_per_step);
  return r;
}

std::string format_rank_bench(const RankBench& r) {
  std::string parallel;
  if (r.parallel > 1 && r.overlapping_steps > 1)
    parallel = fmt::format(
        "{} sequences decoding at once: {:.2f} tokens/s in one step each time, {:.2f} in {} "
        "overlapping steps (each rank computing another) = {:.2f}x (measured, alternating)\n",
        r.parallel, r.parallel_one_step_tokens_per_s, r.parallel_overlapped_tokens_per_s,
        r.overlapping_steps, r.parallel_overlapped_tokens_per_s / r.parallel_one_step_tokens_per_s);
  else if (r.parallel > 1)
    parallel = fmt::format(
        "{} sequences decoding at once: {:.2f} tokens/s; steps do not overlap here (rank 0 takes "
        "part after its share, or uses other ranks' experts in it, or under --spread plan the "
        "cost model predicts no gain: rank_spread.h overlapping_stages)\n",
        r.parallel, r.parallel_one_step_tokens_per_s);
  std::string text = fmt::format(
      "\nover {} ranks (--spread {}): decode {:.2f} tokens/s, {:.2f} in rank 0 alone (measured, "
      "alternating)\neach step sent {:.1f} messages, {:.1f} KiB between ranks, besides rank 0's "
      "{:.1f} announcements ({:.1f} KiB) received while it computes\n"
      "link rank 0 - rank 1 (measured, ping-pong): {:.1f} us a small message, {:.2f} GB/s\n",
      r.n_ranks, r.spread, r.decode_tokens_per_s, r.decode_alone_tokens_per_s, r.messages_per_step,
      r.bytes_per_step / 1024, r.announced_messages_per_step, r.announced_bytes_per_step / 1024,
      r.link.latency_s * 1e6, r.link.bytes_per_s / 1e9);
  text += parallel;
  if (r.comparable)
    return text +
           fmt::format(
               "transfer cost per decode step: measured {:.1f} us (time in which no rank "
               "computed, less {:.1f} us of rank 0 sending its announcements), predicted "
               "{:.1f} us (cost model over that link) = {:.2f}x measured\n",
               r.measured_s_per_step * 1e6, r.announcing_s_per_step * 1e6,
               r.predicted_s_per_step * 1e6,
               r.measured_s_per_step > 0 ? r.predicted_s_per_step / r.measured_s_per_step : 0.0);
  return text + fmt::format(
                    "transfer cost per decode step: not measured here (ranks compute experts at "
                    "the same time, which hides part of the transfers; --spread pipeline measures "
                    "it); the step's transfers take {:.1f} us over that link (cost model)\n",
                    r.predicted_s_per_step * 1e6);
}

nlohmann::ordered_json rank_bench_json(const RankBench& r) {
  return {{"n_ranks", r.n_ranks},
          {"spread", r.spread},
          {"decode_tokens_per_s", r.decode_tokens_per_s},
          {"decode_alone_tokens_per_s", r.decode_alone_tokens_per_s},
          {"messages_per_step", r.messages_per_step},
          {"bytes_per_step", r.bytes_per_step},
          {"announced_messages_per_step", r.announced_messages_per_step},
          {"announced_bytes_per_step", r.announced_bytes_per_step},
          {"link_latency_s", r.link.latency_s},
          {"link_bytes_per_s", r.link.bytes_per_s},
          {"measured_transfer_s_per_step",
           r.comparable ? nlohmann::ordered_json(r.measured_s_per_step) : nullptr},
          {"announcing_s_per_step", r.announcing_s_per_step},
          {"predicted_transfer_s_per_step", r.predicted_s_per_step},
          {"prediction_comparable", r.comparable},
          {"parallel", r.parallel},
          {"overlapping_steps", r.overlapping_steps},
          {"parallel_one_step_tokens_per_s", r.parallel_one_step_tokens_per_s},
          {"parallel_overlapped_tokens_per_s",
           r.overlapping_steps > 1 ? nlohmann::ordered_json(r.parallel_overlapped_tokens_per_s)
                                   : nullptr}};
}

}  // namespace tandem::cli
