// `tandem serve MODEL`: the OpenAI-compatible server. It listens first (GET /health says 503
// while the model loads), then serves through the continuous-batching scheduler; SIGINT or
// SIGTERM stop admitting, end running requests with a final event, and exit 0.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/progress.h"
#include "plan/hardware.h"
#include "runtime/batch_scheduler.h"
#include "runtime/engine.h"
#include "runtime/transport.h"
#include "server/http_server.h"

namespace tandem::cli {

namespace {

// --cache-ram in bytes, after loading (the weights' memory is taken by then).
uint64_t prefix_cache_bytes(int64_t cache_ram_mib) {
  if (cache_ram_mib >= 0) return uint64_t(cache_ram_mib) << 20;
  const uint64_t free = plan::available_ram_bytes();
  if (cache_ram_mib == -1) return free / 2;
  return std::min<uint64_t>(free / 4, uint64_t(8192) << 20);
}

}  // namespace

void register_serve(CLI::App& app) {
  struct Options {
    EngineOptions engine;
    server::ServerOptions server;
    std::string chat_template;
    int64_t cache_ram_mib = -2;  // -2: auto; -1: no limit but the free memory; 0: off
    bool no_prefix_cache = false;
  };
  auto o = std::make_shared<Options>();
  o->engine.n_seq = 4;
  CLI::App* cmd = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions (streaming or not), "
               "/v1/models, /health, /metrics, and a chat page at /. Requests are batched continuously; "
               "each gets the same tokens alone or among others");
  add_engine_options(cmd, o->engine);
  add_spread_option(cmd, o->engine);
  cmd->add_option("--host", o->server.host, "address to listen on (loopback by default; 0.0.0.0 for all)")
      ->capture_default_str();
  cmd->add_option("--port", o->server.port, "port to listen on")->capture_default_str();
  cmd->add_option("--parallel", o->engine.n_seq, "requests served at once (llama.cpp: -np): KV cache slots of --ctx tokens each")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--max-queue", o->server.max_queued, "requests that may wait for a slot before 429")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--api-key", o->server.api_key, "require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option("--model-alias", o->server.model_alias, "model name in /v1/models and responses (default: file name)");
  cmd->add_option("-n,--n-predict", o->server.default_max_tokens,
                  "max_tokens for requests that give none (0: until the context is full)")
      ->capture_default_str();
  cmd->add_option("--chat-template", o->chat_template, kChatTemplateHelp);
  cmd->add_option("--reasoning-format", o->server.reasoning_format,
                  "auto: a reasoning model's reasoning (gpt-oss's analysis channel, <think> "
                  "blocks) comes back as reasoning_content; none: inline in the content")
      ->check(CLI::IsMember({"auto", "none"}))
      ->capture_default_str();
  cmd->add_option("--cache-ram", o->cache_ram_mib,
                  "MiB of host memory for the prefix cache, the KV rows of earlier prompts that "
                  "later prompts starting the same way reuse (llama.cpp: -cram); default: a "
                  "quarter of the memory free after loading, at most 8192; -1: half of it; 0: off")
      ->check(CLI::Range(int64_t(-1), int64_t(1) << 40));
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache,
                "evaluate every prompt whole (the same as --cache-ram 0)");
  cmd->add_option("--max-connections", o->server.max_connections,
                  "connections served at once, idle ones included, each on its own thread; "
                  "more wait for one to close")
      ->capture_default_str()
      ->check(CLI::Range(8, 65536));
  cmd->add_option("--max-header-bytes", o->server.max_header_bytes,
                  "request line and headers larger than this get 431")
      ->capture_default_str()
      ->check(CLI::Range(1024, 1 << 20));
  cmd->add_option("--max-body-bytes", o->server.max_body_bytes,
                  "request bodies larger than this get 413")
      ->capture_default_str()
      ->check(CLI::Range(1024, 1 << 30));
  cmd->add_option("--timeout", o->server.read_timeout_s, "seconds a client may stay silent mid-request")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  cmd->callback([o] {
    // Over several ranks (mpirun) rank 0 listens and schedules; the others load their part and
    // follow its steps.
    if (launched_ranks() > 1 && launched_rank() != 0) {
      Engine engine(o->engine);
      return engine.follow();
    }
    if (!o->chat_template.empty())
      chat_template_from_name(o->chat_template);  // fail before loading
    if (o->server.model_alias.empty())
      o->server.model_alias = std::filesystem::path(o->engine.model_path).stem().string();

    // SIGINT/SIGTERM are taken by one thread with sigwait(); every other thread blocks them.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);

    server::HttpServer http(o->server);
    const int port = http.bind();
    std::thread listener([&] { http.run(); });
    std::atomic<bool> load_failed{false};
    std::thread signal_watcher([&] {
      int signal = 0;
      sigwait(&signals, &signal);
      // Over several ranks nothing can finish without the others, and mpirun's SIGKILL follows
      // its SIGTERM: the running requests end now, with an error their clients see.
      if (launched_ranks() > 1) interrupt_rank_waits();
      if (!load_failed)
        std::fprintf(stderr, "\ntandem serve: %s: %s and stopping\n",
                     signal == SIGINT ? "SIGINT" : "SIGTERM",
                     launched_ranks() > 1 ? "ending running requests with an error"
                                          : "finishing running requests");
      http.stop();
    });
    std::fprintf(stderr, "tandem serve: listening on http://%s:%d (loading %s)\n", o->server.host.c_str(), port,
                 o->engine.model_path.c_str());

    std::unique_ptr<Engine> engine;
    std::unique_ptr<BatchScheduler> scheduler;
    try {
      // Over several ranks, a rank lost mid-step fails the requests it was serving (their
      // clients get the error) before the run ends.
      o->engine.rank_failure_grace_s = 2;
      engine = std::make_unique<Engine>(o->engine);
      const uint64_t cache_bytes = prefix_cache_bytes(o->no_prefix_cache ? 0 : o->cache_ram_mib);
      scheduler = std::make_unique<BatchScheduler>(*engine, o->server.max_queued, cache_bytes);
      std::fprintf(stderr, "tandem serve: prefix cache: %s\n",
                   cache_bytes ? fmt::format("up to {} of host memory (--cache-ram)",
                                             format_bytes(cache_bytes))
                                     .c_str()
                               : "off");
      const std::vector<std::string> devices = engine->device_names();
      const std::string placement =
          devices.size() == 1 ? fmt::format("all on the CPU ({} threads)", engine->n_threads())
                              : fmt::format("CPU ({} threads) and {} (planned by tandem)", engine->n_threads(),
                                            fmt::join(devices.begin() + 1, devices.end(), ", "));
      http.attach({.engine = *engine,
                   .scheduler = *scheduler,
                   .chat_template = choose_chat_template(engine->file(), o->chat_template),
                   .placement = placement});
    } catch (...) {
      load_failed = true;
      http.stop();
      pthread_kill(signal_watcher.native_handle(), SIGTERM);
      signal_watcher.join();
      listener.join();
      throw;
    }
    std::fprintf(stderr,
                 "tandem serve: ready: model '%s', %lld parallel sequences of %lld tokens; chat page at "
                 "http://%s:%d/\n",
                 o->server.model_alias.c_str(), (long long)engine->n_seq(), (long long)engine->n_ctx(),
                 o->server.host.c_str(), port);
    listener.join();
    signal_watcher.join();
    std::fprintf(stderr, "tandem serve: stopped\n");
  });
}

}  // namespace tandem::cli
