#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include "core/error.h"
#include "runtime/batch_scheduler.h"
#include "runtime/engine.h"
#include "server/api_error.h"
#include "server/connection_pool.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/web_page.h"
#include "text/reasoning.h"
#include "text/tokenizer.h"
#include "text/tool_calls.h"

namespace tandem::server {
namespace {

using nlohmann::json;

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = {},
                const std::string& type = "invalid_request_error") {
  res.status = status;
  res.set_content(error_body(status, message, param, type), "application/json");
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string sse(const std::string& data) { return "data: " + data + "\n\n"; }

// A stream's progress between calls of its content provider (httplib calls it until done).
struct StreamState {
  std::shared_ptr<RequestState> request;
  ResponseMeta meta;
  bool include_usage = false, logprobs = false, first = true;
  std::vector<ReasoningSplitter> reasoning;  // each choice's reasoning apart from its answer
  // The tools offered (null: none): each choice's content from where a call section may start is
  // held back until the reply ends, then parsed into calls (or sent as content if it is none).
  std::shared_ptr<const std::vector<ToolSpec>> tools;
  ChatTemplateKind chat_template = ChatTemplateKind::DeepSeekV3;  // whose syntax the calls are in
  std::vector<std::string> held;
  std::vector<std::string> finish_reasons;  // "tool_calls" where a choice made calls
  std::string id_prefix;                    // of the calls' ids
  uint64_t first_call_id = 0;               // 64 ids a choice
};

// Gives the calls of a reply ids and the reply the text around them; false (nothing changed)
// when the reply holds no call.
bool take_tool_calls(ChatTemplateKind kind, const std::vector<ToolSpec>& tools, std::string& text,
                     std::vector<ChatToolCall>& calls, const std::string& id_prefix,
                     uint64_t& next_id) {
  ToolReply reply = parse_tool_reply(kind, text, tools);
  if (reply.calls.empty()) return false;
  for (ChatToolCall& call : reply.calls) call.id = fmt::format("call_{}{}", id_prefix, next_id++);
  text = std::move(reply.content);
  calls = std::move(reply.calls);
  return true;
}

}  // namespace

struct HttpServer::Impl {
  ServerOptions options;
  httplib::Server http;
  std::atomic<const ServingModel*> model{nullptr};
  std::unique_ptr<ServingModel> model_storage;
  HttpCounters counters;
  std::atomic<uint64_t> next_id{1};
  std::string id_prefix;
  std::atomic<bool> stopping{false};
  // Completion requests between their start and the end of their response; stop() waits for
  // them, because httplib stops writing streamed responses once it is stopped, and a stream
  // would lose its final event.
  std::atomic<int> in_flight{0};
  // run() was entered / listen returned: stop() must not call httplib's stop() in the window
  // before listening starts, where it would do nothing and the server would listen forever.
  std::atomic<bool> run_entered{false}, listen_returned{false};

  explicit Impl(ServerOptions o) : options(std::move(o)) {
    std::random_device random;
    id_prefix = fmt::format("{:08x}", random());
    // Every open connection holds a thread while it lasts, idle ones included: the pool grows
    // to --max-connections so idle and slow clients never make others wait (connection_pool.h).
    const size_t threads = options.max_connections;
    http.new_task_queue = [threads] { return new ConnectionPool(threads); };
    http.set_payload_max_length(options.max_body_bytes);
    http.set_read_timeout(options.read_timeout_s, 0);
    http.set_write_timeout(options.read_timeout_s, 0);
    http.set_keep_alive_timeout(5);
    routes();
  }

  std::string new_id(bool chat) { return fmt::format("{}-{}{}", chat ? "chatcmpl" : "cmpl", id_prefix, next_id++); }

  void routes() {
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      // httplib bounds each header line; the whole header block is bounded here
      // (--max-header-bytes).
      size_t header_bytes = req.method.size() + req.target.size() + req.version.size() + 4;
      for (const auto& [name, value] : req.headers) header_bytes += name.size() + value.size() + 4;
      if (header_bytes > options.max_header_bytes) {
        send_error(res, 431,
                   fmt::format("the request's headers take {} bytes, more than the server's "
                               "--max-header-bytes {}",
                               header_bytes, options.max_header_bytes));
        return httplib::Server::HandlerResponse::Handled;
      }
      if (!options.api_key.empty() && req.path.rfind("/v1/", 0) == 0 &&
          req.get_header_value("Authorization") != "Bearer " + options.api_key) {
        send_error(res, 401, "a valid API key is required: send 'Authorization: Bearer <key>'", {},
                   "authentication_error");
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    // Statuses httplib sets itself (404, 413, 400 for a request it cannot parse) get a JSON body.
    http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string message =
          res.status == 404   ? "no such endpoint; see GET /v1/models, POST /v1/chat/completions, /v1/completions"
          : res.status == 413 ? "the request body is too large"
          : res.status == 405 ? "method not allowed on this endpoint"
                              : fmt::format("HTTP error {}", res.status);
      res.set_content(error_body(res.status, message), "application/json");
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string message = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        message = e.what();
      } catch (...) {
      }
      send_error(res, 500, message, {}, "server_error");
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      if (req.path.rfind("/v1/", 0) != 0) return;
      ++counters.requests;
      if (res.status == 429) ++counters.rejected;
      if (res.status >= 400 && res.status < 500) ++counters.client_errors;
      if (res.status >= 500) ++counters.server_errors;
    });

    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      const std::string_view page = web_page_html();
      res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (stopping) return send_error(res, 503, "the server is shutting down", {}, "unavailable");
      if (!model.load()) return send_error(res, 503, "the model is loading", {}, "unavailable");
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json data = json::array();
      if (const ServingModel* m = model.load())
        data.push_back({{"id", options.model_alias}, {"object", "model"}, {"created", unix_seconds()},
                        {"owned_by", "tandem"},
                        {"meta", {{"n_ctx", m->engine.n_ctx()}, {"n_parallel", m->engine.n_seq()},
                                  {"n_vocab", m->engine.n_vocab()}}}});
      res.set_content(json{{"object", "list"}, {"data", data}}.dump(), "application/json");
    });
    http.Get("/props", [this](const httplib::Request&, httplib::Response& res) {
      const ServingModel* m = model.load();
      if (!m) return send_error(res, 503, "the model is loading", {}, "unavailable");
      const SchedulerStats s = m->scheduler.stats();
      res.set_content(json{{"model", options.model_alias},
                           {"placement", m->placement},
                           {"n_ctx", m->engine.n_ctx()},
                           {"n_parallel", m->engine.n_seq()},
                           {"chat_template", chat_template_name(m->chat_template)},
                           {"running", s.running},
                           {"queued", s.queued},
                           {"decode_tokens_per_s", s.decode_seconds > 0 ? double(s.decode_tokens) / s.decode_seconds : 0.0}}
                          .dump(-1, ' ', false, json::error_handler_t::replace),
                      "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      const ServingModel* m = model.load();
      const std::string text = m ? render_metrics(m->scheduler.stats(), counters, m->engine.n_seq(), m->engine.n_ctx())
                                 : render_metrics(SchedulerStats{}, counters, 0, 0);
      res.set_content(text, "text/plain; version=0.0.4");
    });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { completion(req, res, true); });
    http.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { completion(req, res, false); });
    http.Post("/apply-template", [this](const httplib::Request& req, httplib::Response& res) {
      const ServingModel* m = model.load();
      if (!m)
        return send_error(res, 503, "the model is loading; retry when GET /health says ok", {},
                          "unavailable");
      try {
        res.set_content(apply_template_response(req.body, {.tokenizer = m->engine.tokenizer(),
                                                           .chat_template = m->chat_template,
                                                           .n_ctx = m->engine.n_ctx(),
                                                           .default_max_tokens = 0}),
                        "application/json");
      } catch (const ApiError& e) {
        send_error(res, e.status(), e.what(), e.param(), e.type());
      } catch (const Error& e) {
        send_error(res, 400, e.what());
      }
    });
  }

  // Counts a request in flight for as long as it lives (a stream hands it to its releaser).
  struct InFlight {
    std::atomic<int>* count;
    explicit InFlight(std::atomic<int>& c) : count(&c) { ++c; }
    InFlight(InFlight&& other) noexcept : count(std::exchange(other.count, nullptr)) {}
    InFlight(const InFlight&) = delete;
    ~InFlight() {
      if (count) --*count;
    }
  };

  void completion(const httplib::Request& req, httplib::Response& res, bool chat) {
    InFlight in_flight_guard(in_flight);
    const ServingModel* m = model.load();
    if (stopping) return send_error(res, 503, "the server is shutting down", {}, "unavailable");
    if (!m) return send_error(res, 503, "the model is loading; retry when GET /health says ok", {}, "unavailable");
    ParsedRequest parsed;
    std::shared_ptr<RequestState> state;
    try {
      const PromptContext context{.tokenizer = m->engine.tokenizer(),
                                  .chat_template = m->chat_template,
                                  .n_ctx = m->engine.n_ctx(),
                                  .default_max_tokens = options.default_max_tokens};
      parsed = chat ? parse_chat_request(req.body, context) : parse_completion_request(req.body, context);
      state = m->scheduler.submit(parsed.completion);
    } catch (const ApiError& e) {
      return send_error(res, e.status(), e.what(), e.param(), e.type());
    } catch (const Error& e) {
      return send_error(res, stopping ? 503 : 400, e.what());
    }
    if (!state) {
      res.set_header("Retry-After", "1");
      return send_error(res, 429, "all sequences are busy and the queue is full; retry shortly", {},
                        "rate_limit_error");
    }
    const ResponseMeta meta{.id = new_id(chat), .created = unix_seconds(),
                            .model = parsed.model.empty() ? options.model_alias : parsed.model, .chat = chat};
    const Tokenizer& tokenizer = m->engine.tokenizer();
    // Chat replies of reasoning models: reasoning in reasoning_content (--reasoning-format).
    const ReasoningFormat format = chat && options.reasoning_format != "none"
                                       ? reasoning_format_of(m->chat_template)
                                       : ReasoningFormat::None;
    // Each choice's reasoning apart from its answer.
    const std::vector<ReasoningSplitter> splitters(
        size_t(state->n_choices()), ReasoningSplitter(format, parsed.starts_in_reasoning));
    if (!parsed.stream) {
      std::vector<ReasoningSplitter> reasoning = splitters;
      std::vector<ChoiceOutput> choices(reasoning.size());
      std::vector<std::vector<TokenLogprob>> logprobs(reasoning.size());
      auto add = [&](size_t c, const ReasoningSplitter::Delta& d) {
        choices[c].text += d.content, choices[c].reasoning += d.reasoning;
      };
      RequestState::Piece piece;
      while (state->next(piece)) {
        const size_t c = size_t(piece.choice);
        add(c, reasoning[c].push(piece.text));
        logprobs[c].insert(logprobs[c].end(), piece.logprobs.begin(), piece.logprobs.end());
      }
      for (size_t c = 0; c < choices.size(); ++c) {
        add(c, reasoning[c].finish());
        choices[c].finish_reason = state->finish_reason(int32_t(c));
        if (parsed.logprobs) choices[c].logprobs = &logprobs[c];
        uint64_t id = next_id.fetch_add(64);  // ids for the choice's calls
        if (parsed.tools && take_tool_calls(m->chat_template, *parsed.tools, choices[c].text,
                                            choices[c].tool_calls, id_prefix, id))
          choices[c].finish_reason = "tool_calls";
      }
      if (state->failure() == "error")
        return send_error(res, 500, state->error(), {}, "server_error");
      if (state->failure() == "cancelled")
        return send_error(res, 503, "the server is shutting down; the request was cancelled", {}, "unavailable");
      res.set_content(full_response(meta, choices, tokenizer,
                                    {state->prompt_tokens(), state->completion_tokens(),
                                     state->cached_tokens()}),
                      "application/json");
      return;
    }
    auto stream = std::make_shared<StreamState>(
        StreamState{.request = state,
                    .meta = meta,
                    .include_usage = parsed.include_usage,
                    .logprobs = parsed.logprobs,
                    .reasoning = splitters,
                    .tools = parsed.tools,
                    .chat_template = m->chat_template,
                    .held = std::vector<std::string>(splitters.size()),
                    .finish_reasons = {},
                    .id_prefix = id_prefix,
                    .first_call_id = next_id.fetch_add(64 * uint64_t(splitters.size()))});
    auto stream_in_flight = std::make_shared<InFlight>(std::move(in_flight_guard));
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [stream, &tokenizer](size_t, httplib::DataSink& sink) {
          const auto write = [&](const std::string& text) {
            if (!sink.write(text.data(), text.size())) {
              stream->request->cancel();  // the client is gone: free its sequence
              return false;
            }
            return true;
          };
          RequestState::Piece piece;
          const int32_t n_choices = int32_t(stream->reasoning.size());
          if (stream->first && stream->meta.chat) {  // the role comes first, before any token
            stream->first = false;
            for (int32_t c = 0; c < n_choices; ++c)
              if (!write(sse(
                      stream_chunk(stream->meta, c, "", true, nullptr, tokenizer, std::nullopt))))
                return false;
            return true;
          }
          // Content that may be the start of tool calls waits in `held` until the reply ends.
          auto releasable = [&](size_t c, std::string content) {
            if (!stream->tools) return content;
            std::string& held = stream->held[c];
            held += content;
            const size_t n = tool_section_start(stream->chat_template, held);
            std::string out = held.substr(0, n);
            held.erase(0, n);
            return out;
          };
          if (stream->request->next(piece)) {
            ReasoningSplitter::Delta d = stream->reasoning[size_t(piece.choice)].push(piece.text);
            d.content = releasable(size_t(piece.choice), std::move(d.content));
            if (d.empty() && piece.logprobs.empty()) return true;
            return write(sse(stream_chunk(stream->meta, piece.choice, d.content, false,
                                          stream->logprobs ? &piece.logprobs : nullptr, tokenizer,
                                          std::nullopt, d.reasoning)));
          }
          const RequestState& r = *stream->request;
          stream->finish_reasons.assign(size_t(n_choices), "");
          for (int32_t c = 0; c < n_choices; ++c) {
            ReasoningSplitter::Delta d = stream->reasoning[size_t(c)].finish();
            std::vector<ChatToolCall> calls;
            if (stream->tools) {
              std::string& held = stream->held[size_t(c)];
              held += d.content;
              uint64_t id = stream->first_call_id + 64 * uint64_t(c);
              if (take_tool_calls(stream->chat_template, *stream->tools, held, calls,
                                  stream->id_prefix, id))
                stream->finish_reasons[size_t(c)] = "tool_calls";
              d.content = std::move(held);
            }
            if (!d.empty() && !write(sse(stream_chunk(stream->meta, c, d.content, false, nullptr,
                                                      tokenizer, std::nullopt, d.reasoning))))
              return false;
            if (!calls.empty() && !write(sse(tool_calls_chunk(stream->meta, c, calls))))
              return false;
          }
          if (const std::string failure = r.failure(); !failure.empty()) {
            const std::string message =
                failure == "error" ? r.error() : "the server is shutting down";
            if (!write(sse(json{{"error", {{"message", message}, {"type", "server_error"}}}}.dump()))) return false;
          } else {
            for (int32_t c = 0; c < n_choices; ++c)
              if (!write(sse(stream_chunk(stream->meta, c, "", false, nullptr, tokenizer,
                                          stream->finish_reasons[size_t(c)].empty()
                                              ? r.finish_reason(c)
                                              : stream->finish_reasons[size_t(c)]))))
                return false;
            if (stream->include_usage &&
                !write(sse(usage_chunk(
                    stream->meta, {r.prompt_tokens(), r.completion_tokens(), r.cached_tokens()}))))
              return false;
          }
          if (!write("data: [DONE]\n\n")) return false;
          sink.done();
          return true;
        },
        [stream, stream_in_flight](bool success) {
          if (!success) stream->request->cancel();
        });
  }
};

HttpServer::HttpServer(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const ServerOptions& o = impl_->options;
  if (o.port == 0) {
    const int port = impl_->http.bind_to_any_port(o.host);
    if (port < 0) fail("cannot listen on {}: no free port", o.host);
    return port;
  }
  if (!impl_->http.bind_to_port(o.host, o.port))
    fail("cannot listen on {}:{}: the address is in use or not available; choose another with --host/--port",
         o.host, o.port);
  return o.port;
}

void HttpServer::run() {
  impl_->run_entered = true;
  if (!impl_->stopping) impl_->http.listen_after_bind();
  impl_->listen_returned = true;
}

void HttpServer::attach(const ServingModel& model) {
  impl_->model_storage = std::make_unique<ServingModel>(model);
  impl_->model.store(impl_->model_storage.get());
}

void HttpServer::stop() {
  if (impl_->stopping.exchange(true)) return;
  if (const ServingModel* m = impl_->model.load()) m->scheduler.shutdown();
  // Running requests end at the scheduler's next step; give their responses (final events of
  // streams) up to 10 s to reach the clients.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (impl_->in_flight > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (impl_->run_entered)
    while (!impl_->http.is_running() && !impl_->listen_returned)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl_->http.stop();
}

}  // namespace tandem::server
