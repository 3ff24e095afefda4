// `tandem run MODEL -p TEXT`: continue a prompt, printing text as it is generated, then one line
// with prompt and decode speed.
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "plan/routing_profile.h"
#include "runtime/session.h"
#include "runtime/transport.h"
#include "text/tokenizer.h"

namespace tandem::cli {

void register_run(CLI::App& app) {
  struct Options {
    EngineOptions engine;
    GenerateOptions generate;
    std::string prompt;
    bool seed_given = false;
    bool no_bos = false;
    bool special = false;
    std::string save_profile;
  };
  auto o = std::make_shared<Options>();
  o->generate.max_tokens = 128;
  CLI::App* cmd = app.add_subcommand(
      "run", "Continue a prompt with a model, printing the text as it is generated and the "
             "prompt and decode speed at the end");
  add_engine_options(cmd, o->engine);
  add_spread_option(cmd, o->engine);
  cmd->add_option("-p,--prompt", o->prompt, "prompt text")->required();
  cmd->add_option("-n,--n-predict", o->generate.max_tokens, "tokens to generate at most")
      ->capture_default_str();
  cmd->add_option("--stop", o->generate.stop, "stop when this text is generated (repeatable)");
  cmd->add_flag("--no-bos", o->no_bos, "do not add the BOS token the model's metadata asks for");
  cmd->add_flag("--special", o->special, "parse special tokens such as <｜User｜> in the prompt");
  cmd->add_option("--save-profile", o->save_profile,
                  "write the expert routing counts of this run as a routing profile (JSON)");
  add_sampling_options(cmd, o->generate.sampling, o->seed_given);
  cmd->callback([o] {
    if (!o->seed_given) o->generate.sampling.seed = random_seed();
    validate(o->generate.sampling);
    Engine engine(o->engine);
    if (engine.follows()) return engine.follow();  // rank 0 samples and prints
    const Tokenizer& tokenizer = engine.tokenizer();
    const std::vector<int32_t> prompt = tokenizer.encode(
        o->prompt, {.add_bos = tokenizer.add_bos_by_default() && !o->no_bos, .parse_special = o->special});
    if (o->engine.verbose)
      std::fprintf(stderr, "tandem: prompt %zu tokens, seed %llu\n", prompt.size(),
                   (unsigned long long)o->generate.sampling.seed);
    Session session(engine);
    const GenerateResult r = session.generate(prompt, o->generate, [](std::string_view text) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    const double decode_tps = r.tokens.size() > 1 ? double(r.tokens.size() - 1) / r.decode_seconds : 0.0;
    std::fprintf(stderr, "\n\nprompt: %d tokens, %.2f tokens/s | decode: %zu tokens, %.2f tokens/s | %s\n",
                 r.prompt_tokens, double(r.prompt_tokens_evaluated) / r.prompt_seconds, r.tokens.size(),
                 decode_tps, r.finish_reason.c_str());
    if (o->engine.verbose)
      std::fprintf(stderr, "tandem: load %.2f s, time to first token %.3f s (after load)\n",
                   engine.load_seconds(), r.first_token_seconds);
    if (!o->save_profile.empty()) plan::save_routing_profile(engine.routing_profile(), o->save_profile);
  });
}

}  // namespace tandem::cli
