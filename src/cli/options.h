#pragma once
// Flags shared by the subcommands that load a model and sample from it, with llama.cpp's names
// and defaults so that people's habits carry over.
#include <CLI/CLI.hpp>

#include "runtime/engine.h"
#include "text/chat_template.h"
#include "text/sampler.h"

namespace tandem::cli {

void add_engine_options(CLI::App* cmd, EngineOptions& options);
// --no-pin (part of add_engine_options).
void add_thread_options(CLI::App* cmd, EngineOptions& options);
// --mlock and --repack (part of add_engine_options).
void add_load_options(CLI::App* cmd, EngineOptions& options);
// --cache-type-k and --cache-type-v (part of add_engine_options; `tandem plan` gives its own).
void add_cache_type_options(CLI::App* cmd, EngineOptions& options);
void add_cache_type_options(CLI::App* cmd, DType& keys, DType& values);
// --devices and --rules (part of add_engine_options).
void add_device_options(CLI::App* cmd, EngineOptions& options);
// --spread and --rank-timeout: commands that run over several ranks (mpirun).
void add_spread_option(CLI::App* cmd, EngineOptions& options);
// --precision (part of add_engine_options).
void add_precision_option(CLI::App* cmd, EngineOptions& options);
// Adds --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n,
// --presence-penalty, --frequency-penalty, --seed. `seed_given` tells whether --seed was used.
void add_sampling_options(CLI::App* cmd, SamplerParams& params, bool& seed_given);
// The chat template named on the command line, else the one the file's Jinja source is
// recognised as, else DeepSeek V3's format with a notice on stderr.
ChatTemplateKind choose_chat_template(const gguf::GgufFile& file, const std::string& override_name);
// What --chat-template says it takes, for the help texts.
inline constexpr const char* kChatTemplateHelp =
    "override the model's template: deepseek2, deepseek3, deepseek-r1, deepseek-v3.1, chatml, "
    "qwen3, "
    "gpt-oss, glm4.5 or kimi-k2";
// A seed from the clock, for runs without --seed (printed with --verbose to reproduce them).
uint64_t random_seed();

}  // namespace tandem::cli
