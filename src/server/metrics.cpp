#include "server/metrics.h"

#include <fmt/format.h>

namespace tandem::server {
namespace {

void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  out += fmt::format("# HELP tandem_{0} {1}\n# TYPE tandem_{0} {2}\ntandem_{0} {3}\n", name, help, type, value);
}

}  // namespace

std::string render_metrics(const SchedulerStats& s, const HttpCounters& http, int64_t n_seq, int64_t n_ctx) {
  std::string out;
  metric(out, "requests_total", "counter", "API requests answered, any status", double(http.requests.load()));
  metric(out, "requests_client_errors_total", "counter", "API requests answered with a 4xx status",
         double(http.client_errors.load()));
  metric(out, "requests_rejected_total", "counter", "requests refused with 429 because the queue was full",
         double(http.rejected.load()));
  metric(out, "requests_server_errors_total", "counter", "API requests answered with a 5xx status",
         double(http.server_errors.load()));
  metric(out, "prompt_tokens_total", "counter", "prompt tokens evaluated", double(s.prompt_tokens));
  metric(out, "generated_tokens_total", "counter", "tokens generated", double(s.generated_tokens));
  metric(out, "prompt_seconds_total", "counter", "seconds spent in prompt steps", s.prompt_seconds);
  metric(out, "decode_seconds_total", "counter", "seconds spent in decode steps", s.decode_seconds);
  metric(out, "prefill_tokens_per_second", "gauge", "prompt tokens per second of prompt steps, since start",
         s.prompt_seconds > 0 ? double(s.prompt_tokens) / s.prompt_seconds : 0.0);
  metric(out, "decode_tokens_per_second", "gauge",
         "tokens per second of decode steps (all sequences together), since start",
         s.decode_seconds > 0 ? double(s.decode_tokens) / s.decode_seconds : 0.0);
  metric(out, "overlapped_steps_total", "counter",
         "steps (prompt or decode) started while another ran on later ranks (a pipeline over MPI "
         "ranks)",
         double(s.overlapped_steps));
  metric(out, "requests_running", "gauge", "requests holding a sequence slot", double(s.running));
  metric(out, "requests_queued", "gauge", "requests waiting for a slot", double(s.queued));
  metric(out, "kv_cache_tokens", "gauge", "KV cache rows held by running requests", double(s.cached_tokens));
  metric(out, "kv_cache_capacity_tokens", "gauge", "KV cache rows in all (slots x context)",
         double(n_seq * n_ctx));
  metric(out, "kv_cache_usage_ratio", "gauge", "kv_cache_tokens / kv_cache_capacity_tokens",
         n_seq * n_ctx > 0 ? double(s.cached_tokens) / double(n_seq * n_ctx) : 0.0);
  const PrefixCache::Stats& pc = s.prefix_cache;
  metric(out, "prefix_cache_hit_tokens_total", "counter",
         "prompt tokens whose KV rows came from the prefix cache instead of being evaluated",
         double(pc.hit_tokens));
  metric(out, "prefix_cache_lookups_total", "counter", "requests that looked up the prefix cache",
         double(pc.lookups));
  metric(out, "prefix_cache_hits_total", "counter", "requests that reused a cached prefix",
         double(pc.hits));
  metric(out, "prefix_cache_bytes", "gauge", "host memory holding cached prefixes' KV rows",
         double(pc.bytes));
  metric(out, "prefix_cache_budget_bytes", "gauge", "the prefix cache's limit (--cache-ram)",
         double(s.prefix_cache_budget));
  metric(out, "prefix_cache_evicted_blocks_total", "counter",
         "cached blocks dropped, least recently used first, to stay within the budget",
         double(pc.evicted_blocks));
  out += "# HELP tandem_expert_choices_total routed-expert choices since load, by the device holding the expert\n";
  out += "# TYPE tandem_expert_choices_total counter\n";
  for (const auto& [device, count] : s.expert_choices)
    out += fmt::format("tandem_expert_choices_total{{device=\"{}\"}} {}\n", device, count);
  return out;
}

}  // namespace tandem::server
