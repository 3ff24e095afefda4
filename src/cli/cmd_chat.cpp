// `tandem chat MODEL`: an interactive multi-turn chat using the model's chat template.
// Ctrl-C stops the reply being written; Ctrl-D (end of input) quits.
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "gguf/gguf_file.h"
#include "runtime/session.h"
#include "runtime/transport.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tandem::cli {
namespace {

std::atomic<bool> g_interrupted{false};

void on_sigint(int) { g_interrupted.store(true); }

}  // namespace

void register_chat(CLI::App& app) {
  struct Options {
    EngineOptions engine;
    GenerateOptions generate;
    std::string system, chat_template;
    bool seed_given = false;
  };
  auto o = std::make_shared<Options>();
  o->generate.max_tokens = 1024;
  CLI::App* cmd = app.add_subcommand(
      "chat",
      "Interactive multi-turn chat with the model's chat template. Type a message and "
      "press Enter; Ctrl-C stops a reply (under mpirun it ends the run), Ctrl-D quits");
  add_engine_options(cmd, o->engine);
  add_spread_option(cmd, o->engine);
  cmd->add_option("--system", o->system, "system prompt");
  cmd->add_option("--chat-template", o->chat_template, kChatTemplateHelp);
  cmd->add_option("-n,--n-predict", o->generate.max_tokens, "tokens per reply at most")->capture_default_str();
  add_sampling_options(cmd, o->generate.sampling, o->seed_given);
  cmd->callback([o] {
    if (!o->seed_given) o->generate.sampling.seed = random_seed();
    validate(o->generate.sampling);
    if (!o->chat_template.empty())
      chat_template_from_name(o->chat_template);  // fail before loading
    Engine engine(o->engine);
    // Over MPI ranks rank 0 reads (mpirun gives only it the terminal's input) and samples.
    if (engine.follows()) return engine.follow();
    const Tokenizer& tokenizer = engine.tokenizer();
    const ChatTemplateKind kind = choose_chat_template(engine.file(), o->chat_template);
    const std::string bos = tokenizer.bos_id() ? std::string(tokenizer.token_text(*tokenizer.bos_id())) : "";
    std::vector<ChatMessage> messages;
    if (!o->system.empty()) messages.push_back({"system", o->system});

    struct sigaction action{};
    action.sa_handler = on_sigint;
    sigaction(SIGINT, &action, nullptr);  // no SA_RESTART: Ctrl-C at the prompt ends getline
    // mpirun passes the terminal's input through a pipe: a person is typing all the same.
    const bool interactive = ::isatty(STDIN_FILENO) || engine.n_ranks() > 1;
    // mpirun ends every rank on Ctrl-C: it does not pass SIGINT on.
    std::fprintf(stderr, "tandem chat: %s template, context %lld tokens. %s, Ctrl-D quits.\n",
                 std::string(chat_template_name(kind)).c_str(), (long long)engine.n_ctx(),
                 engine.n_ranks() > 1 ? "Ctrl-C ends the run (mpirun)" : "Ctrl-C stops a reply");
    Session session(engine);
    std::string line;
    for (;;) {
      if (interactive) std::fputs("\n> ", stdout), std::fflush(stdout);
      g_interrupted.store(false);
      if (!std::getline(std::cin, line)) {
        if (g_interrupted.load() && !std::cin.eof()) {  // Ctrl-C at the prompt: keep going
          std::cin.clear();
          continue;
        }
        break;
      }
      if (line.empty()) continue;
      messages.push_back({"user", line});
      const std::string text = apply_chat_template(kind, messages, true, bos);
      const std::vector<int32_t> prompt = tokenizer.encode(text, {.add_bos = false, .parse_special = true});
      GenerateResult reply;
      try {
        reply = session.generate(prompt, o->generate, [](std::string_view piece) {
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
          return !g_interrupted.load();
        });
      } catch (const Error& e) {
        // The conversation no longer fits: say so and let the person start over or quit.
        std::fprintf(stderr, "\ntandem: %s\n", e.what());
        messages.pop_back();
        continue;
      }
      std::fputs("\n", stdout);
      if (reply.finish_reason == "cancelled") std::fputs("[stopped]\n", stderr);
      // The slot keeps the conversation's rows between turns, so each turn evaluates only what
      // changed since the last one (its new message, and a reply the template rewrites).
      if (o->engine.verbose)
        std::fprintf(
            stderr, "[prompt %d tokens, %d evaluated, %d cached; %zu tokens, %.2f tokens/s]\n",
            reply.prompt_tokens, reply.prompt_tokens_evaluated,
            reply.prompt_tokens - reply.prompt_tokens_evaluated, reply.tokens.size(),
            reply.tokens.size() > 1 ? double(reply.tokens.size() - 1) / reply.decode_seconds : 0.0);
      messages.push_back({"assistant", reply.text});
    }
  });
}

}  // namespace tandem::cli
