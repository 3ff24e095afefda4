// `tandem repack`: rewrites a model with its Q8_0 / Q4_K matrices interleaved 16 rows at a time
// for the CPU decode kernels (model/repack.h).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "model/repack.h"

namespace tandem::cli {

void register_repack(CLI::App& app) {
  auto options = std::make_shared<RepackOptions>();
  auto threads = std::make_shared<int>(physical_core_count());
  CLI::App* cmd = app.add_subcommand(
      "repack",
      "Write a copy of a model whose Q8_0, Q5_0 and Q4_K matrices store 16 rows together "
      "(formats Q8_0_R16, Q5_0_R16, Q4_K_R16), which the AVX-512 decode kernels read about twice as fast. Same "
      "weights (Q4_K matrices 2.8% larger: scales stored as bytes); results equal the original's "
      "within rounding. The output is a GGUF "
      "that only tandem reads (other tools do not know these formats). Token embeddings and "
      "other tables keep their format. Only for CPUs with AVX-512 (VNNI): elsewhere a repacked "
      "model runs slower than the original, whose file you should keep using there.");
  cmd->add_option("input", options->input_path, "model GGUF (first part of a split model)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("output", options->output_path, "GGUF file to write (one file)")->required();
  cmd->add_option("-t,--threads", *threads, "threads for the conversion (default: physical cores)")
      ->capture_default_str();
  cmd->add_flag("--no-progress", [options](int64_t) { options->show_progress = false; },
                "do not print progress");
  cmd->callback([options, threads] {
    std::error_code ec;
    if (std::filesystem::equivalent(options->input_path, options->output_path, ec))
      fail("{}: the output would overwrite the input; name another file", options->output_path);
    const std::filesystem::path parent = std::filesystem::path(options->output_path).parent_path();
    if (!parent.empty() && !std::filesystem::create_directories(parent, ec) && ec)
      fail("{}: cannot create the folder: {}", parent.string(), ec.message());
    ThreadPool pool(*threads);
    const RepackSummary summary = repack_model(*options, pool);
    fmt::print("wrote {}: {} of {} tensors interleaved ({}), {} in {:.1f} s ({}/s)\n",
               options->output_path, summary.n_interleaved, summary.n_tensors,
               format_bytes(summary.interleaved_bytes), format_bytes(summary.file_bytes),
               summary.seconds,
               format_bytes(uint64_t(double(summary.file_bytes) / std::max(summary.seconds, 1e-9))));
    if (summary.n_interleaved == 0)
      fmt::print("note: no Q8_0, Q5_0 or Q4_K matrix with a multiple of 16 rows was found; the copy is "
                 "the same model\n");
  });
}

}  // namespace tandem::cli
