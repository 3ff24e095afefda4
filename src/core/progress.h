#pragma once
// Progress for long work (writing a 10 GB model, loading, repacking): one line on stderr,
// redrawn in place on a terminal and printed every 10% otherwise (logs, CI), with bytes/s.
#include <chrono>
#include <cstdint>
#include <string>

namespace tandem {

class Progress {
 public:
  Progress(std::string label, uint64_t total_bytes, bool enabled = true);
  ~Progress();
  void advance(uint64_t bytes) { update(done_bytes_ + bytes); }
  void update(uint64_t done_bytes);
  void finish();

 private:
  void draw(bool final_line);

  std::string label_;
  uint64_t total_bytes_;
  uint64_t done_bytes_ = 0;
  bool enabled_;
  bool terminal_;
  bool finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

// "1.50 GiB", "512.0 KiB", "17 B".
std::string format_bytes(uint64_t bytes);

}  // namespace tandem
