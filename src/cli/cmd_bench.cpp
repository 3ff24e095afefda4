// `tandem bench MODEL`: prefill and decode speed in the style of llama-bench (repetitions,
// mean ± sd), next to what bounds them on this machine, all measured in the same run: memory
// bandwidth (a STREAM-style triad before and after), the decode roofline (bandwidth / bytes of
// weights one token reads, counting only the experts it uses), and the peak throughput of our
// own matmul kernels for prefill. Also prints the cost model's prediction for the same devices,
// and with --cold a cold start (load + first token from an emptied page cache) against the time
// the disk needs for the bytes it read.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>

#include "backends/cpu/matmul.h"
#include "backends/cuda/cuda_devices.h"
#include "cli/bench_ranks.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "core/background_reader.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "gguf/gguf_file.h"
#include "plan/cost_model.h"
#include "plan/hardware.h"
#include "plan/inventory.h"
#include "plan/kernel_rate.h"
#include "plan/planner.h"
#include "quant/quant.h"
#include "runtime/cold_start.h"
#include "runtime/device_setup.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/transport.h"

namespace tandem::cli {
namespace {

struct Stat {
  double mean = 0, sd = 0;
};

Stat stats(const std::vector<double>& values) {
  Stat s;
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
  for (double v : values) s.sd += (v - s.mean) * (v - s.mean);
  s.sd = values.size() > 1 ? std::sqrt(s.sd / double(values.size() - 1)) : 0.0;
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Best seconds per call of our matmul of a random `type` matrix [rows, cols] (cache-resident
// after the warm-up) against `tokens` random tokens, with activations of `precision`.
double best_matmul_seconds(DType type, int64_t rows, int64_t cols, int64_t tokens, int threads,
                           int calls_per_rep, cpu::ActPrecision precision) {
  ThreadPool pool(threads);
  std::vector<float> w(size_t(rows * cols)), x(size_t(tokens * cols)), y(size_t(tokens * rows));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& v : w) v = normal(rng);
  for (float& v : x) v = normal(rng);
  const size_t stride = row_bytes(type, cols);
  std::vector<uint8_t> q(stride * rows);
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, w.data() + r * cols, q.data() + r * stride, cols);
  const cpu::MatmulArgs args{.weight_type = type, .weights = q.data(), .rows = rows, .cols = cols,
                             .input = x.data(), .n_tokens = tokens, .output = y.data(),
                             .precision = precision};
  cpu::matmul(args, pool);  // warm up
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls_per_rep; ++i) cpu::matmul(args, pool);
    best = std::min(best, seconds_since(start) / calls_per_rep);
  }
  return best;
}

// Peak arithmetic throughput of our matmul kernels with cache-resident weights and many tokens
// (what prefill could reach), in multiply-adds x 2 per second, with the activations the policy
// gives the FFNs (the bulk of a prompt's arithmetic).
double kernel_peak_flops(DType type, int threads, PrecisionPolicy policy) {
  // Enough rows that preparing the 64 tokens' activations (per call, not per row) is a few percent.
  const int64_t rows = 2048, cols = 2048, tokens = 64;
  const cpu::ActPrecision precision =
      policy == PrecisionPolicy::FfnInt8 ? cpu::ActPrecision::Int8 : cpu::ActPrecision::Int16;
  return 2.0 * double(rows * cols * tokens) /
         best_matmul_seconds(type, rows, cols, tokens, threads, 1, precision);
}

// Cold starts are measured with a one-token prompt (loading, then the first token: what the disk
// bounds) and a short chat message (where computing the prompt starts to count).
const std::vector<size_t> kColdPromptTokens = {1, 16};

}  // namespace

void register_bench(CLI::App& app) {
  struct Options {
    EngineOptions engine;
    int64_t prompt = 512, generate = 128;
    std::vector<int64_t> depths = {0};
    int repetitions = 3;
    bool json = false;
    bool cold = false;
    bool warmup = true;
    int32_t parallel = 1;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Measure prefill and decode tokens/s (llama-bench style) against this machine's "
               "measured memory bandwidth and kernel peak, and the cost model's prediction");
  cmd->add_option("model", o->engine.model_path, "GGUF model")->required();
  cmd->add_option("-p,--n-prompt", o->prompt, "prompt tokens per prefill test (0 = skip)")->capture_default_str();
  cmd->add_option("-n,--n-gen", o->generate, "tokens per decode test (0 = skip)")->capture_default_str();
  cmd->add_option("-d,--n-depth", o->depths,
                  "tokens already in the context before each prefill and decode test (as llama-bench's -d); "
                  "decode then also reads a KV cache that long. A list (-d 0,4096) runs each test at every "
                  "depth, repetitions alternating between them, and prints each depth's decode against the "
                  "first's; the roofline and model lines are for the first depth")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-r,--repetitions", o->repetitions, "repetitions of each test")->capture_default_str();
  cmd->add_option("-t,--threads", o->engine.n_threads, "CPU threads (default: physical cores)");
  cmd->add_option(
         "--parallel", o->parallel,
         "under mpirun, also decode this many sequences at once (--n-gen tokens each), in one "
         "step each time and in overlapping steps (a pipeline's ranks each computing another "
         "step, as serve runs them), repetitions alternating")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->add_flag("!--no-warmup", o->warmup,
                "skip the untimed warm-up (a prompt of up to 512 tokens and a few decode steps, "
                "as llama-bench) before the tests: without it the first repetition pays for the "
                "first touches of the weights");
  cmd->add_flag("--cold", o->cold,
                "first measure cold starts: drop the model from the page cache, load it and run a 1- and a "
                "16-token prompt, --repetitions times each; compared with reading only the bytes they needed "
                "(alternating with them), and with the same start warm");
  add_device_options(cmd, o->engine);
  add_thread_options(cmd, o->engine);
  add_load_options(cmd, o->engine);
  add_cache_type_options(cmd, o->engine);
  add_precision_option(cmd, o->engine);
  add_spread_option(cmd, o->engine);
  cmd->callback([o] {
    if (o->cold && launched_ranks() > 1) fail("--cold measures one process: run it without mpirun");
    if (o->repetitions < 1) fail("--repetitions must be at least 1");
    if (o->parallel > 1 && launched_ranks() <= 1)
      fail("--parallel measures overlapping steps over MPI ranks: run bench under mpirun -np N");
    o->engine.n_seq = o->parallel;
    if (o->depths.empty()) o->depths = {0};
    for (int64_t d : o->depths)
      if (d < 0) fail("--n-depth must be 0 or more (got {})", d);
    const int64_t depth = o->depths.front(), deepest = *std::max_element(o->depths.begin(), o->depths.end());
    const int threads = o->engine.n_threads > 0 ? o->engine.n_threads : physical_core_count();
    o->engine.n_threads = threads;
    o->engine.n_ctx = std::max<int64_t>({o->prompt, o->generate, int64_t(kColdPromptTokens.back())}) + deepest + 1;

    std::vector<ColdStart> cold;
    for (size_t n_tokens : o->cold ? kColdPromptTokens : std::vector<size_t>{}) {
      // Tokens 3..99 exist in every vocabulary.
      std::vector<int32_t> prompt(n_tokens);
      for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(3 + (i * 37) % 97);
      if (!o->json)
        fmt::print(stderr, "tandem: measuring a cold start with a {}-token prompt (dropping the model from the page cache)\n", n_tokens);
      cold.push_back(measure_cold_start(o->engine, prompt, o->repetitions));
    }

    // The GPUs as they are before the model fills them (free memory, rates measured on an idle
    // GPU), for the cost model's plan of the same run.
    const bool names_gpus = o->engine.devices.find("cuda") != std::string::npos || o->engine.devices == "auto";
    const std::vector<plan::DeviceSpec> gpus =
        names_gpus && cuda::count_gpus() > 0 ? plan::detect_gpus() : std::vector<plan::DeviceSpec>{};
    const double bandwidth_before = plan::measure_memory_bandwidth(threads);
    Engine engine(o->engine);
    if (engine.follows()) return engine.follow();  // rank 0 measures and prints
    const plan::ModelInventory inventory = plan::inventory_from_file(engine.file());
    const int64_t n_vocab = engine.n_vocab();
    std::mt19937 rng(42);
    std::uniform_int_distribution<int32_t> token(3, int32_t(std::min<int64_t>(n_vocab, 4096)) - 1);
    std::vector<float> logits;

    auto random_tokens = [&](int64_t n) {
      std::vector<int32_t> tokens(static_cast<size_t>(n));
      for (int32_t& t : tokens) t = token(rng);
      return tokens;
    };
    // --n-depth: the context before each test, not timed.
    auto fill_context = [&](int64_t d) {
      if (d > 0) engine.evaluate(random_tokens(d), 0, 0, false, logits);
    };
    // Per depth, in -d's order. Each repetition runs every depth, so a slow spell of a noisy
    // machine falls on all of them alike.
    const size_t n_depths = o->depths.size();
    std::vector<std::vector<double>> prefill_at(n_depths), decode_at(n_depths);
    // As llama-bench: an untimed prompt first, so that the first repetition does not pay for the
    // first touches of the weights (a prompt of a few hundred tokens reaches nearly every expert:
    // side by side with ik_llama.cpp, pp512 without it spread 57.8 ± 25.2 t/s, the first
    // repetition the slow one).
    if (o->warmup && o->prompt > 0)
      engine.evaluate(random_tokens(std::min<int64_t>(o->prompt, 512)), 0, 0, false, logits);
    for (int rep = 0; rep < o->repetitions && o->prompt > 0; ++rep) {
      for (size_t k = 0; k < n_depths; ++k) {
        fill_context(o->depths[k]);
        const std::vector<int32_t> tokens = random_tokens(o->prompt);
        const auto start = std::chrono::steady_clock::now();
        engine.evaluate(tokens, int32_t(o->depths[k]), 0, false, logits);
        prefill_at[k].push_back(double(o->prompt) / seconds_since(start));
      }
    }
    // And a few untimed decode steps (measured: `-p 0 -n 32 -d 0,4096 -r 3` without it gave depth
    // 0 13.14 ± 6.24 t/s, its first repetition far the slowest, and "96%" for depth 4096).
    if (o->warmup && o->generate > 0)
      for (int64_t i = 0; i < std::min<int64_t>(o->generate, 8); ++i) {
        const int32_t t = token(rng);
        engine.evaluate(std::span<const int32_t>(&t, 1), int32_t(i), 0, false, logits);
      }
    for (int rep = 0; rep < o->repetitions && o->generate > 0; ++rep) {
      for (size_t k = 0; k < n_depths; ++k) {
        fill_context(o->depths[k]);
        const auto start = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < o->generate; ++i) {
          const int32_t t = token(rng);
          engine.evaluate(std::span<const int32_t>(&t, 1), int32_t(o->depths[k] + i), 0, false, logits);
        }
        decode_at[k].push_back(double(o->generate) / seconds_since(start));
      }
    }
    std::optional<RankBench> ranks;
    if (engine.n_ranks() > 1)
      ranks = bench_ranks(engine, o->engine, o->generate, o->repetitions, o->parallel);
    const std::vector<double>& prefill_tps = prefill_at.front();
    const std::vector<double>& decode_tps = decode_at.front();
    const double bandwidth_after = plan::measure_memory_bandwidth(threads);

    const double bandwidth = (bandwidth_before + bandwidth_after) / 2;
    const uint64_t bytes_per_token = inventory.bytes_read_per_token();
    // A decode step also reads its sequence's KV cache: on average depth + (n_gen - 1) / 2 rows,
    // a sliding-window layer at most its window.
    const ModelInfo& info = engine.info();
    uint64_t cache_per_token = 0;
    const int64_t rows = o->generate > 0 ? depth + (o->generate - 1) / 2 : 0;
    const uint64_t value_bytes = dtype_info(engine.kv_cache().type()).block_bytes;
    for (uint32_t il = 0; il < info.kv.size(); ++il) {
      const int64_t window = info.kv[il].window;
      cache_per_token += uint64_t(info.kv[il].row_floats()) * value_bytes *
                         uint64_t(window > 0 ? std::min(rows, window) : rows);
    }
    const double roofline = bandwidth / double(bytes_per_token + cache_per_token);
    const double peak_flops = kernel_peak_flops(DType::Q8_0, threads, o->engine.precision);
    const double decode_kernel = plan::measure_decode_kernel_bytes_per_s(threads, 0);
    // A repacked model's interleaved bytes go through the interleaved kernels: their own rate.
    const uint64_t interleaved_per_token = inventory.interleaved_bytes_read_per_token();
    const double interleaved_kernel =
        interleaved_per_token > 0 ? plan::measure_decode_kernel_bytes_per_s(threads, 0, true) : 0;
    // Active parameters per token: the weights a token reads, counted in elements.
    double active_params = 0;
    for (const gguf::TensorInfo& t : engine.file().tensors()) {
      const double share =
          t.name.find("_exps.") != std::string::npos
              ? double(inventory.info.n_expert_used) / double(inventory.info.n_expert)
              : 1.0;
      if (t.name.rfind("blk.", 0) == 0 || t.name.rfind("output.", 0) == 0)
        active_params += share * double(t.n_elements);
    }
    const Stat pp = prefill_tps.empty() ? Stat{} : stats(prefill_tps);
    const Stat tg = decode_tps.empty() ? Stat{} : stats(decode_tps);
    const double prefill_flops = pp.mean * 2.0 * active_params;

    // The cost model's prediction for this machine as measured now.
    plan::Hardware hardware = plan::detect_hardware(threads, /*with_gpus=*/false);
    hardware.host.bandwidth_bytes_per_s = bandwidth;
    hardware.host.flops_per_s = peak_flops;
    hardware.host.decode_kernel_bytes_per_s = decode_kernel;
    hardware.host.interleaved_kernel_bytes_per_s = interleaved_kernel;
    hardware.host.bandwidth_source = "measured in this run";
    const double kernel_ceiling =
        decode_kernel / plan::kernel_equivalent_bytes(
                            hardware.host, double(bytes_per_token), double(interleaved_per_token),
                            double(inventory.host_kernel_extra_bytes_read_per_token()));
    // The devices the engine runs on, in its order: GPUs with the rates measured on them (cached),
    // simulated devices computing with one thread of their own (sim_backend.h).
    const std::vector<uint64_t> sim_budgets = parse_sim_devices(o->engine.devices);
    const double sim_kernel = sim_budgets.empty() ? 0 : plan::measure_decode_kernel_bytes_per_s(1, 0);
    const double sim_interleaved_kernel = sim_budgets.empty() || interleaved_per_token == 0
                                              ? 0
                                              : plan::measure_decode_kernel_bytes_per_s(1, 0, true);
    const std::vector<std::string> device_names = engine.device_names();
    size_t next_sim = 0;
    for (size_t d = 1; d < device_names.size(); ++d) {
      if (device_names[d].starts_with("cuda:")) {
        for (const plan::DeviceSpec& gpu : gpus)
          if (gpu.name == device_names[d]) hardware.gpus.push_back(gpu);
        continue;
      }
      const int32_t index = int32_t(next_sim);
      hardware.gpus.push_back({.name = fmt::format("sim:{}", index), .kind = plan::DeviceKind::Sim,
                               .model = "simulated", .memory_bytes = sim_budgets.at(next_sim++),
                               .bandwidth_bytes_per_s = bandwidth, .flops_per_s = peak_flops / threads,
                               .decode_kernel_bytes_per_s = sim_kernel,
                               .interleaved_kernel_bytes_per_s = sim_interleaved_kernel,
                               .bandwidth_source = "host bandwidth (simulated device)"});
    }
    // A GPU's roofline: its measured copy bandwidth over the bytes a token reads (everything the
    // model reads per token, as if the GPU held it all: exact for a plan that puts the whole model
    // on the GPU, an upper bound for a hybrid one, where the cost model's prediction is the bar).
    nlohmann::ordered_json gpu_json = nlohmann::ordered_json::array();
    std::string gpu_lines;
    for (const plan::DeviceSpec& gpu : hardware.gpus) {
      if (gpu.kind != plan::DeviceKind::Cuda) continue;
      const double gpu_roofline = gpu.bandwidth_bytes_per_s / double(bytes_per_token + cache_per_token);
      gpu_json.push_back({{"name", gpu.name}, {"model", gpu.model},
                          {"copy_gb_per_s", gpu.bandwidth_bytes_per_s / 1e9},
                          {"decode_kernel_gb_per_s", gpu.decode_kernel_bytes_per_s / 1e9},
                          {"decode_roofline_tokens_per_s", gpu_roofline},
                          {"decode_fraction_of_roofline", tg.mean / gpu_roofline}});
      gpu_lines += fmt::format(
          "{} {}: memory bandwidth {:.0f} GB/s (measured, device copy), decode kernel {:.0f} GB/s (measured, Q4_K "
          "x 1 token); decode roofline if it held the whole model: {:.1f} tokens/s; measured decode = {:.0f}% of it\n",
          gpu.name, gpu.model, gpu.bandwidth_bytes_per_s / 1e9, gpu.decode_kernel_bytes_per_s / 1e9, gpu_roofline,
          100.0 * tg.mean / gpu_roofline);
    }
    // The placement the engine runs, with its devices' rates as measured here; a CPU-only run
    // was not planned, so the planner places it on this hardware.
    const plan::Workload workload{.n_ctx = o->engine.n_ctx,
                                  .n_parallel = 1,
                                  .prefill_batch = o->prompt,
                                  .cache_type = o->engine.cache_type_k};
    plan::Placement placement;
    if (const plan::Placement* ran = engine.placement(); ran && ran->devices.size() == hardware.gpus.size() + 1) {
      placement = *ran;
      placement.devices[0].spec = hardware.host;
      for (size_t d = 1; d < placement.devices.size(); ++d)
        placement.devices[d].spec = hardware.gpus[d - 1];
      placement.predicted = plan::predict_speed(inventory, hardware, workload, placement, nullptr);
      placement.predicted.stream_experts_min_tokens =
          plan::stream_experts_min_tokens(inventory, hardware, workload, placement, nullptr);
      // Prompts as they ran: the host's experts streamed or not (--stream-experts may differ).
      if (placement.predicted.experts_streamable) {
        const int64_t from = engine.stream_experts_min_tokens();
        const bool streamed = from > 0 && o->prompt >= from;
        placement.predicted.prefill_tokens_per_s = plan::predict_prefill_tokens_per_s(
            inventory, hardware, workload, placement, nullptr, streamed);
        placement.predicted.prefill_tokens_per_s_host_experts =
            streamed ? plan::predict_prefill_tokens_per_s(inventory, hardware, workload, placement,
                                                          nullptr, false)
                     : 0;
      }
    } else {
      placement = plan::plan_placement(inventory, hardware, workload, plan::Rules{}, nullptr);
    }

    // Which of the planner's candidates the engine runs ("layer split", "expert parallel over 2
    // GPUs", ...): what the prediction is for.
    std::string layout = "all on the CPU";
    for (const plan::Candidate& c : placement.candidates)
      if (c.chosen && placement.devices.size() > 1) layout = c.name;
    const std::string name = std::filesystem::path(o->engine.model_path).filename().string();
    if (o->json) {
      nlohmann::ordered_json out = {
          {"model", name},
          {"threads", threads},
          {"devices", o->engine.devices},
          {"precision", precision_policy_name(o->engine.precision)},
          {"cache_type", std::string(dtype_name(engine.kv_cache().type()))},
          {"n_prompt", o->prompt},
          {"n_gen", o->generate},
          {"n_depth", depth},
          {"repetitions", o->repetitions},
          {"prefill_tokens_per_s", pp.mean},
          {"prefill_tokens_per_s_sd", pp.sd},
          {"decode_tokens_per_s", tg.mean},
          {"decode_tokens_per_s_sd", tg.sd},
          {"bandwidth_gb_per_s", bandwidth / 1e9},
          {"bandwidth_before_gb_per_s", bandwidth_before / 1e9},
          {"bandwidth_after_gb_per_s", bandwidth_after / 1e9},
          {"bytes_read_per_token", bytes_per_token},
          {"kv_cache_bytes_read_per_token", cache_per_token},
          {"decode_roofline_tokens_per_s", roofline},
          {"decode_fraction_of_roofline", tg.mean / roofline},
          {"decode_kernel_gb_per_s", decode_kernel / 1e9},
          {"interleaved_kernel_gb_per_s", interleaved_kernel / 1e9},
          {"interleaved_bytes_read_per_token", interleaved_per_token},
          {"decode_kernel_ceiling_tokens_per_s", kernel_ceiling},
          {"kernel_peak_gflops", peak_flops / 1e9},
          {"prefill_gflops", prefill_flops / 1e9},
          {"prefill_fraction_of_kernel_peak", prefill_flops / peak_flops},
          {"predicted_prefill_tokens_per_s", placement.predicted.prefill_tokens_per_s},
          {"predicted_decode_tokens_per_s", placement.predicted.decode_tokens_per_s},
          {"stream_experts_min_tokens", engine.stream_experts_min_tokens()},
          {"placement", layout},
          {"engine_devices", device_names},
          {"gpus", gpu_json}};
      if (n_depths > 1)
        for (size_t k = 0; k < n_depths; ++k) {
          const Stat p = prefill_at[k].empty() ? Stat{} : stats(prefill_at[k]);
          const Stat d = decode_at[k].empty() ? Stat{} : stats(decode_at[k]);
          out["depths"].push_back({{"n_depth", o->depths[k]}, {"prefill_tokens_per_s", p.mean},
                                   {"prefill_tokens_per_s_sd", p.sd}, {"decode_tokens_per_s", d.mean},
                                   {"decode_tokens_per_s_sd", d.sd},
                                   {"decode_fraction_of_first_depth", tg.mean > 0 ? d.mean / tg.mean : 0.0}});
        }
      for (const ColdStart& c : cold) {
        const Stat first = stats(c.first_token_seconds), load = stats(c.load_seconds), read = stats(c.read_seconds);
        out["cold_start"].push_back({{"prompt_tokens", c.prompt_tokens}, {"first_token_s", first.mean},
                                     {"first_token_s_sd", first.sd}, {"load_s", load.mean},
                                     {"warm_first_token_s", c.warm_first_token_seconds > 0 ? nlohmann::json(c.warm_first_token_seconds) : nlohmann::json(nullptr)},
                                     {"touched_bytes", c.touched_bytes}, {"read_touched_s", read.mean},
                                     {"read_touched_s_sd", read.sd}, {"ratio_to_read", first.mean / read.mean}});
      }
      if (ranks) out["ranks"] = rank_bench_json(*ranks);
      fmt::print("{}\n", out.dump(2));
      return;
    }
    // Test names as llama-bench writes them: pp512, tg128, tg128 @ d4096.
    fmt::print("| {:<28} | {:>10} | {:>7} | {:>14} | {:>16} |\n", "model", "size", "threads", "test", "t/s (measured)");
    fmt::print("|{:-<30}|{:-<12}|{:-<9}|{:-<16}|{:-<18}|\n", "", "", "", "", "");
    const std::string size = format_bytes(inventory.total_weight_bytes());
    auto row = [&](const std::string& test, int64_t d, const std::vector<double>& tps) {
      if (tps.empty()) return;
      const Stat st = stats(tps);
      fmt::print("| {:<28} | {:>10} | {:>7} | {:>14} | {:>16} |\n", name, size, threads,
                 d > 0 ? fmt::format("{} @ d{}", test, d) : test, fmt::format("{:.2f} ± {:.2f}", st.mean, st.sd));
    };
    for (size_t k = 0; k < n_depths; ++k)
      row(fmt::format("pp{}", o->prompt), o->depths[k], prefill_at[k]);
    for (size_t k = 0; k < n_depths; ++k)
      row(fmt::format("tg{}", o->generate), o->depths[k], decode_at[k]);
    for (size_t k = 1; k < n_depths && tg.mean > 0; ++k)
      fmt::print(
          "decode at depth {}: {:.0f}% of decode at depth {} (repetitions alternating between "
          "depths; "
          "{} KV cache)\n",
          o->depths[k], 100.0 * stats(decode_at[k]).mean / tg.mean, depth,
          dtype_name(engine.kv_cache().type()));
    if (ranks) fmt::print("{}", format_rank_bench(*ranks));
    fmt::print("\nmemory bandwidth (measured, triad on {} threads): {:.1f} GB/s before, {:.1f} GB/s after\n", threads,
               bandwidth_before / 1e9, bandwidth_after / 1e9);
    const std::string cache_read = cache_per_token > 0 ? fmt::format(" + {} of KV cache", format_bytes(cache_per_token)) : "";
    fmt::print("decode roofline: {:.1f} GB/s / {}{} per token = {:.2f} tokens/s; measured decode = {:.0f}% of it\n",
               bandwidth / 1e9, format_bytes(bytes_per_token), cache_read, roofline, 100.0 * tg.mean / roofline);
    const uint64_t slow_extra = inventory.host_kernel_extra_bytes_read_per_token();
    const std::string slow_formats =
        slow_extra == 0 ? ""
                        : fmt::format(" (the grid i-quants counted at their own cost per byte: as {} more)",
                                      format_bytes(slow_extra));
    if (interleaved_per_token == 0)
      fmt::print("decode kernel (measured, Q4_K x 1 token, weights from DRAM): {:.1f} GB/s of weights{} = {:.2f} "
                 "tokens/s at most, whatever the bandwidth; measured decode = {:.0f}% of it\n",
                 decode_kernel / 1e9, slow_formats, kernel_ceiling, 100.0 * tg.mean / kernel_ceiling);
    else
      fmt::print("decode kernels (measured, x 1 token, weights from DRAM): Q4_K {:.1f} GB/s for the {} of plain "
                 "formats, Q4_K_R16 {:.1f} GB/s for the {} interleaved = {:.2f} tokens/s at most, whatever the "
                 "bandwidth; measured decode = {:.0f}% of it\n",
                 decode_kernel / 1e9, format_bytes(bytes_per_token - interleaved_per_token), interleaved_kernel / 1e9,
                 format_bytes(interleaved_per_token), kernel_ceiling, 100.0 * tg.mean / kernel_ceiling);
    fmt::print("{}", gpu_lines);
    fmt::print("kernel peak (measured, Q8_0 x 64 tokens, cache-resident, {} activations as the FFNs take them): "
               "{:.1f} GFLOP/s; {}\n",
               o->engine.precision == PrecisionPolicy::FfnInt8 ? "8-bit" : "16-bit", peak_flops / 1e9,
               pp.mean > 0 ? fmt::format("prefill reaches {:.1f} GFLOP/s = {:.0f}% of it", prefill_flops / 1e9,
                                         100.0 * prefill_flops / peak_flops)
                           : std::string("prefill not measured"));
    // A skipped test (-p 0 or -n 0) has nothing to compare with.
    auto versus_measured = [](double predicted, double measured) {
      return measured > 0 ? fmt::format("{:.2f}x measured", predicted / measured) : std::string("not measured");
    };
    fmt::print("cost model (predicted for --devices {}, {}): prefill {:.2f} tokens/s ({}), decode {:.2f} tokens/s ({})\n",
               o->engine.devices, layout, placement.predicted.prefill_tokens_per_s,
               versus_measured(placement.predicted.prefill_tokens_per_s, pp.mean),
               placement.predicted.decode_tokens_per_s,
               versus_measured(placement.predicted.decode_tokens_per_s, tg.mean));
    if (const std::string streaming =
            plan::expert_streaming_summary(placement.predicted, engine.stream_experts_min_tokens(),
                                           o->engine.stream_experts >= 0, o->prompt);
        !streaming.empty())
      fmt::print("{}\n", streaming);
    if (!cold.empty()) {
      fmt::print("\ncold start: load + first token from an emptied page cache, against reading only the bytes it "
                 "needed (in file order into an empty cache, as the engine reads: {} threads), mean ± sd of {}, "
                 "and against the same start warm\n", BackgroundReader::kThreads, o->repetitions);
      fmt::print("| prompt | cold: load + first token | of which load | warm | needed from the file | reading them alone | cold / reading |\n");
      fmt::print("|-------:|-------------------------:|-------------:|-----:|---------------------:|-------------------:|---------------:|\n");
      bool warm_skipped = false;
      for (const ColdStart& c : cold) {
        warm_skipped |= c.warm_first_token_seconds == 0;
        const std::string warm =
            c.warm_first_token_seconds > 0 ? fmt::format("{:.2f} s", c.warm_first_token_seconds) : "–";
        const Stat first = stats(c.first_token_seconds), load = stats(c.load_seconds), read = stats(c.read_seconds);
        fmt::print("| {} | {:.2f} ± {:.2f} s | {:.2f} s | {} | {} of {} | {:.2f} ± {:.2f} s ({:.2f} GB/s) | {:.2f}x |\n",
                   c.prompt_tokens, first.mean, first.sd, load.mean, warm, format_bytes(c.touched_bytes),
                   format_bytes(c.file_bytes), read.mean, read.sd, double(c.touched_bytes) / read.mean / 1e9,
                   first.mean / read.mean);
      }
      if (warm_skipped)
        fmt::print("–: the warm start was not measured: the model did not fit in 90% of the free memory then "
                   "(other files in the page cache count as used)\n");
    }
  });
}

}  // namespace tandem::cli
