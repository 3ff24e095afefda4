#pragma once
// GET /metrics: the server's counters in Prometheus' text format (version 0.0.4).
#include <atomic>
#include <cstdint>
#include <string>

#include "runtime/batch_scheduler.h"

namespace tandem::server {

// Counted by the HTTP layer, read by /metrics.
struct HttpCounters {
  std::atomic<uint64_t> requests{0};       // API requests answered (any status)
  std::atomic<uint64_t> client_errors{0};  // 4xx
  std::atomic<uint64_t> rejected{0};       // 429: queue full
  std::atomic<uint64_t> server_errors{0};  // 5xx
};

std::string render_metrics(const SchedulerStats& stats, const HttpCounters& http, int64_t n_seq,
                           int64_t n_ctx);

}  // namespace tandem::server
