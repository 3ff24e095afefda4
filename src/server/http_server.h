#pragma once
// The OpenAI-compatible HTTP server (cpp-httplib): POST /v1/chat/completions and
// /v1/completions (streamed as server-sent events or whole), GET /v1/models, /health, /metrics,
// /props and the chat page at "/". It listens before the model is loaded (so /health can say
// 503 "loading"), then serves through a BatchScheduler once attach() hands it the model.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "text/chat_template.h"

namespace httplib {
class Server;
}

namespace tandem {
class Engine;
class BatchScheduler;
}

namespace tandem::server {

struct HttpCounters;

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int port = 8080;                 // 0: any free port (tests)
  std::string api_key;             // non-empty: /v1/* needs "Authorization: Bearer KEY"
  std::string model_alias;         // the model's name in /v1/models and in responses
  int32_t max_queued = 32;         // requests waiting beyond the busy slots before 429
  size_t max_body_bytes = size_t(8) << 20;  // larger bodies get 413
  size_t max_header_bytes = 16384;          // request line and headers; more gets 431
  // Connections read and answered at once, each on a thread of its own while it lasts (a
  // connection beyond these waits for one to end). Idle and slow clients take one each.
  size_t max_connections = 1024;
  int read_timeout_s = 10;         // a client that sends nothing for this long is dropped
  int32_t default_max_tokens = 0;  // when a request names none; 0 = until the context is full
  // "auto": a reasoning model's reasoning goes to reasoning_content (Harmony's analysis channel,
  // <think> blocks); "none": it stays in the content as the model wrote it.
  std::string reasoning_format = "auto";
};

// What the server serves once the model is loaded.
struct ServingModel {
  Engine& engine;
  BatchScheduler& scheduler;
  ChatTemplateKind chat_template;
  std::string placement;  // where the model runs, in words (for /props and the page)
};

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();

  // Binds the address; returns the port. Throws tandem::Error naming the address when it cannot.
  int bind();
  // Serves until stop(); returns after the last connection has finished.
  void run();
  // From now on the API answers (before: 503, model loading).
  void attach(const ServingModel& model);
  // Stops admitting requests; running ones end with a final event (streams) or a 503; then the
  // server stops listening and run() returns. Safe from any thread.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::server
