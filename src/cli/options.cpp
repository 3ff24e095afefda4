#include "cli/options.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>

#include "gguf/gguf_file.h"

namespace tandem::cli {

void add_engine_options(CLI::App* cmd, EngineOptions& options) {
  cmd->add_option("model", options.model_path, "GGUF model (first part of a split model)")->required();
  cmd->add_option("-t,--threads", options.n_threads, "CPU threads (default: physical cores)");
  cmd->add_option("-c,--ctx", options.n_ctx,
                  "context length in tokens (default: the model's, capped to half the free memory)");
  cmd->add_flag("-v,--verbose", options.verbose, "print load details and timings");
  add_thread_options(cmd, options);
  add_load_options(cmd, options);
  add_cache_type_options(cmd, options);
  add_device_options(cmd, options);
  add_precision_option(cmd, options);
}

void add_cache_type_options(CLI::App* cmd, EngineOptions& options) {
  add_cache_type_options(cmd, options.cache_type_k, options.cache_type_v);
}

void add_cache_type_options(CLI::App* cmd, DType& keys, DType& values) {
  auto add = [&](const char* names, DType& type, const char* what) {
    cmd->add_option_function<std::string>(
           names,
           [&type](const std::string& name) { type = name == "bf16" ? DType::BF16 : DType::F32; },
           fmt::format("type of the KV cache's {}: f32 (default) or bf16 (half the memory and half "
                       "the reads at long context, scores and sums with AVX-512 BF16's vdpbf16ps; "
                       "values, queries and softmax weights rounded to bf16; the CPU only; give "
                       "--cache-type-k and --cache-type-v the same). f16 and quantized caches are "
                       "not built",
                       what))
        ->check(CLI::IsMember({"f32", "bf16"}))
        ->default_str("f32");
  };
  add("--cache-type-k", keys, "keys");
  add("--cache-type-v", values, "values");
}

void add_precision_option(CLI::App* cmd, EngineOptions& options) {
  cmd->add_option_function<std::string>(
         "--precision",
         [&options](const std::string& name) {
           options.precision = name == "int16" ? PrecisionPolicy::Int16 : PrecisionPolicy::FfnInt8;
         },
         "activations of the CPU's quantized products: ffn-int8 (default: the experts' and FFNs' "
         "products with 8-bit activations, as llama.cpp takes them everywhere, and the attention "
         "projections of models with softmax routers: qwen3moe, gpt-oss, DeepSeek-V2; the other "
         "attention, router and output head with 16-bit) or int16 (every product with 16-bit "
         "activations: closest "
         "to F32, prompts ~1.15x slower). GPUs follow it for the experts at decode (8-bit "
         "activations with ffn-int8) and multiply F32 activations elsewhere")
      ->check(CLI::IsMember({"ffn-int8", "int16"}))
      ->default_str("ffn-int8");
}

void add_thread_options(CLI::App* cmd, EngineOptions& options) {
  cmd->add_flag("!--no-pin", options.pin_threads,
                "let the OS move the CPU threads between cores (default: each thread pinned to its own "
                "physical core when there are enough)");
}

void add_load_options(CLI::App* cmd, EngineOptions& options) {
  cmd->add_flag("--mlock", options.mlock,
                "lock the model in RAM (reads it all first) so it is never paged out; needs a "
                "memlock limit above the model size (ulimit -l)");
  cmd->add_flag("--repack", options.repack,
                "load the model's copy with its Q8_0/Q5_0/Q4_K matrices stored 16 rows together "
                "(as `tandem repack` writes it), which AVX-512 CPUs decode faster and prompt as "
                "fast: made on first use beside the model as NAME.tandem-r16.gguf (about the "
                "model's size; ~1 minute per 10 GB, with progress; one run at a time), or in "
                "$XDG_CACHE_HOME/tandem or ~/.cache/tandem where that folder is not writable or "
                "full, and reused while the model's size and header match the ones it recorded. "
                "Without AVX-512 it says so and runs the file as it is.");
  cmd->add_flag("--repack-in-memory", options.repack_in_memory,
                "make the same copy in RAM at every load instead, no file written (for a model "
                "whose folder and cache cannot hold a second copy): costs the repack each run "
                "(~1 minute per 10 GB) and the copy's size in RAM beside the model's pages in the "
                "page cache");
}

void add_device_options(CLI::App* cmd, EngineOptions& options) {
  cmd->add_option("--devices", options.devices,
                  "where to run, besides the CPU: auto (every GPU found; the CPU alone without "
                  "one), cpu, cuda (every GPU), cuda:0,cuda:1, or simulated devices that stand in "
                  "for GPUs (sim:2x200MiB, sim:200MiB,sim:1GiB); the planner places the model")
      ->capture_default_str();
  cmd->add_flag("!--no-graphs", options.graphs,
                "run every decode step op by op instead of replaying it as a captured graph "
                "(CUDA graphs; simulated devices capture too): for debugging, same results");
  cmd->add_option("--stream-experts", options.stream_experts,
                  "prompt chunks of at least N tokens copy the experts kept in RAM to their "
                  "layer's GPU and compute them there (the PCIe link against the CPU's cores); "
                  "-1: the cost model chooses N (`tandem plan` shows it), 0: the CPU always "
                  "computes them")
      ->check(CLI::Range(int64_t(-1), std::numeric_limits<int64_t>::max()))
      ->capture_default_str();
  cmd->add_option("--rules", options.rules, "rule file (YAML) pinning weight groups to devices");
  cmd->add_option("--profile", options.profile,
                  "routing profile from `tandem profile`: the most-used experts are placed on the "
                  "devices first");
}

void add_spread_option(CLI::App* cmd, EngineOptions& options) {
  cmd->add_option("--spread", options.spread,
                  "under `mpirun -np N`, how the model is divided between the N ranks (one per "
                  "machine, or several on one for testing): plan (the default when every rank "
                  "has devices: where a plan over N machines like this one puts each part, as "
                  "`tandem plan --nodes N` plans, the fastest predicted), pipeline (consecutive "
                  "layers per rank; the default on CPUs "
                  "alone), experts (each MoE layer's routed experts over every rank, the rest on "
                  "rank 0) or mixed (both). Each rank maps the same GGUF from its own path and "
                  "places its part on its own devices; rank 0 prints or serves")
      ->check(CLI::IsMember({"plan", "pipeline", "experts", "mixed"}));
  cmd->add_option("--cluster", options.cluster,
                  "under `mpirun -np N`: plan over the N machines this YAML file describes (as "
                  "`tandem plan --cluster` does) instead of N like this one; rank R runs machine "
                  "R's parts on its --devices, which stand for that machine's GPUs in order")
      ->check(CLI::ExistingFile);
  cmd->add_option("--rank-timeout", options.rank_timeout_s,
                  "seconds a rank waits for another mid-step before the run ends with the "
                  "missing rank named")
      ->capture_default_str();
}

void add_sampling_options(CLI::App* cmd, SamplerParams& p, bool& seed_given) {
  // llama.cpp's defaults.
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.min_p = 0.05f;
  cmd->add_option("--temp", p.temperature, "temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", p.top_k, "keep the k most likely tokens; 0 = off")->capture_default_str();
  cmd->add_option("--top-p", p.top_p, "nucleus sampling mass; 1 = off")->capture_default_str();
  cmd->add_option("--min-p", p.min_p, "drop tokens below min-p x the best one's probability; 0 = off")
      ->capture_default_str();
  cmd->add_option("--repeat-penalty", p.repeat_penalty, "penalty for recent tokens; 1 = off")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", p.repeat_last_n, "how many recent tokens the penalties see")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", p.presence_penalty, "OpenAI presence penalty; 0 = off")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", p.frequency_penalty, "OpenAI frequency penalty; 0 = off")
      ->capture_default_str();
  cmd->add_option_function<uint64_t>(
      "-s,--seed", [&p, &seed_given](uint64_t seed) { p.seed = seed, seed_given = true; },
      "random seed (default: from the clock); same seed and threads, same output");
}

uint64_t random_seed() {
  return uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull;
}

ChatTemplateKind choose_chat_template(const gguf::GgufFile& file,
                                      const std::string& override_name) {
  if (!override_name.empty()) return chat_template_from_name(override_name);
  const std::string source = file.get_string_or("tokenizer.chat_template", "");
  if (std::optional<ChatTemplateKind> kind = detect_chat_template(source)) return *kind;
  std::fprintf(stderr, "tandem: %s; using the DeepSeek V3 format (choose with --chat-template)\n",
               source.empty() ? "the model has no chat template" : "the model's chat template is not recognised");
  return ChatTemplateKind::DeepSeekV3;
}

}  // namespace tandem::cli
