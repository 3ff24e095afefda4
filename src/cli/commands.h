#pragma once
// Registration of the `tandem` subcommands; each is defined in its own cmd_*.cpp.
#include <CLI/CLI.hpp>

namespace tandem::cli {

void register_commands(CLI::App& app);

void register_inspect(CLI::App& app);
void register_gen_model(CLI::App& app);
void register_eval(CLI::App& app);
void register_run(CLI::App& app);
void register_chat(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_profile(CLI::App& app);
void register_bench(CLI::App& app);
void register_plan(CLI::App& app);
void register_serve(CLI::App& app);
void register_repack(CLI::App& app);
void register_apply_template(CLI::App& app);

}  // namespace tandem::cli
