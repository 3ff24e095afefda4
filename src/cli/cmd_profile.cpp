// `tandem profile MODEL --prompts FILE -o OUT`: runs prompts through the model and records how
// often each routed expert of each layer is chosen, for `tandem plan --profile` and
// `tandem run --devices … --profile` (most-used experts go to the fast devices first).
#include <fmt/format.h>

#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "plan/routing_profile.h"
#include "runtime/session.h"
#include "runtime/transport.h"
#include "text/tokenizer.h"

namespace tandem::cli {

void register_profile(CLI::App& app) {
  struct Options {
    EngineOptions engine;
    std::string prompts, out;
    int32_t n_generate = 32;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "profile", "Count how often each routed expert is chosen over a file of prompts (one per "
                 "line) and write a routing profile that `plan` and `run` can read");
  add_engine_options(cmd, o->engine);
  add_spread_option(cmd, o->engine);
  cmd->add_option("--prompts", o->prompts, "text file, one prompt per line")->required();
  cmd->add_option("-o,--output", o->out, "routing profile to write (JSON)")->required();
  cmd->add_option("-n,--n-predict", o->n_generate, "tokens generated (greedy) after each prompt")
      ->capture_default_str();
  cmd->callback([o] {
    // Over ranks rank 0 reads the prompts (before loading, to fail early) and the others follow.
    std::vector<std::string> prompts;
    if (launched_rank() == 0) {
      std::ifstream in(o->prompts);
      if (!in) fail("{}: cannot read the prompts", o->prompts);
      for (std::string line; std::getline(in, line);)
        if (!line.empty()) prompts.push_back(line);
      if (prompts.empty()) fail("{}: no prompts (one per line)", o->prompts);
    }
    Engine engine(o->engine);
    if (engine.follows()) return engine.follow();
    const Tokenizer& tokenizer = engine.tokenizer();
    GenerateOptions generate{.max_tokens = o->n_generate};
    generate.sampling.temperature = 0;
    uint64_t tokens = 0;
    for (const std::string& prompt : prompts) {
      std::vector<int32_t> ids = tokenizer.encode(prompt, {.add_bos = tokenizer.add_bos_by_default()});
      if (int64_t(ids.size()) + o->n_generate >= engine.n_ctx())
        ids.resize(size_t(engine.n_ctx() / 2));
      Session session(engine);  // each prompt from an empty cache
      const GenerateResult r = session.generate(ids, generate, [](std::string_view) { return true; });
      tokens += ids.size() + r.tokens.size();
    }
    plan::save_routing_profile(engine.routing_profile(), o->out);
    fmt::print("wrote {}: routing of {} tokens over {} prompts\n", o->out, tokens, prompts.size());
  });
}

}  // namespace tandem::cli
