// `tandem gen-model`: writes a synthetic GGUF of any architecture tandem runs (seeded random
// weights, real layout, trained tokenizer) for tests, benchmarks and planning where no real
// weights can be had.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "model/synthetic_model.h"

namespace tandem::cli {

void register_gen_model(CLI::App& app) {
  auto options = std::make_shared<SyntheticOptions>();
  auto threads = std::make_shared<int>(physical_core_count());
  auto layers = std::make_shared<uint32_t>(0);
  std::string presets_help = "model shape:";
  for (const SyntheticPreset& preset : synthetic_presets())
    presets_help +=
        fmt::format("\n  {:<22} {:<9} {}", preset.name, preset.arch, preset.description);

  CLI::App* cmd = app.add_subcommand(
      "gen-model",
      "Write a GGUF with seeded random weights of realistic scale and a small trained tokenizer "
      "(deepseek2, qwen3moe, gpt-oss or glm4moe). Its text output is meaningless (random "
      "weights); it exists so that tests, benchmarks and plans run on real shapes without "
      "downloading a model.");
  cmd->add_option("--preset", options->preset, presets_help)->capture_default_str();
  cmd->add_option("--arch", options->arch,
                  "architecture of a preset several have (micro): deepseek2 (default), qwen3moe, "
                  "gpt-oss, glm4moe");
  cmd->add_option("-o,--output", options->output_path, "GGUF file to write")->required();
  cmd->add_option("--format", options->format,
                  "weight mix: Q4_K_M (Q4_K + Q6_K, Q5_0/Q8_0 for short rows, as converters do), "
                  "IQ4_XS (IQ4_NL for short rows, Q6_K output), Q8_0, BF16, F16, F32, MXFP4_MOE "
                  "(MXFP4 experts, Q8_0 elsewhere: gpt-oss as shipped); Q4_1, "
                  "TQ1_0, TQ2_0, MXFP4, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S "
                  "(every matrix but the Q6_K output; rows that are not whole 256-blocks Q4_0 "
                  "for TQ, IQ4_NL for the IQ formats), for benches of those formats, written by "
                  "a simple nearest-grid-point quantizer; norms and router stay F32")
      ->capture_default_str();
  cmd->add_option("--seed", options->seed, "random seed (same seed, same file)")->capture_default_str();
  cmd->add_option("--layers", *layers, "override the preset's layer count (0 = preset's)");
  cmd->add_option("-t,--threads", *threads, "threads for generation (default: physical cores)")
      ->capture_default_str();
  cmd->add_flag("--no-progress", [options](int64_t) { options->show_progress = false; },
                "do not print progress");
  cmd->callback([options, threads, layers] {
    if (*layers) options->n_layers = *layers;
    // Like `-o models/micro.gguf` on a fresh checkout: the folder is created, not an error.
    const std::filesystem::path parent = std::filesystem::path(options->output_path).parent_path();
    std::error_code ec;
    if (!parent.empty() && !std::filesystem::create_directories(parent, ec) && ec)
      fail("{}: cannot create the folder: {}", parent.string(), ec.message());
    ThreadPool pool(*threads);
    const SyntheticSummary summary = write_synthetic_model(*options, pool);
    fmt::print(
        "wrote {}: preset {} ({}), {}, {} tensors, {} in {:.1f} s ({}/s)\n", options->output_path,
        options->preset, find_synthetic_preset(options->preset, options->arch).arch,
        options->format, summary.n_tensors, format_bytes(summary.file_bytes), summary.seconds,
        format_bytes(uint64_t(double(summary.file_bytes) / std::max(summary.seconds, 1e-9))));
  });
}

}  // namespace tandem::cli
