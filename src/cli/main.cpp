// tandem: the command-line entry. Each subcommand lives in its own file (cmd_*.cpp) and is
// registered here; this file only wires CLI11 and turns errors into one-line messages.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{
      "tandem: runs giant Mixture-of-Experts models (DeepSeek-V2/V3/R1, Kimi-K2, Qwen3-MoE, "
      "gpt-oss, GLM-4.5) on CPUs and GPUs.\nThe CUDA backend has run deepseek2 models on one "
      "H200; qwen3moe, gpt-oss and glm4moe have not yet\nrun on a GPU (tools/gpu-check.sh "
      "verifies it). Not yet built: NUMA placement, several machines (see README.md)."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tandem 0.1.0");
  tandem::cli::register_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
