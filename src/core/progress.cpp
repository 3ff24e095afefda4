#include "core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace tandem {

std::string format_bytes(uint64_t bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = double(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", value, kUnits[unit]);
}

Progress::Progress(std::string label, uint64_t total_bytes, bool enabled)
    : label_(std::move(label)),
      total_bytes_(total_bytes),
      enabled_(enabled),
      terminal_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::update(uint64_t done_bytes) {
  done_bytes_ = done_bytes;
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (terminal_) {
    if (now - last_draw_ < std::chrono::milliseconds(100)) return;
  } else {
    const int decile = total_bytes_ ? int(done_bytes_ * 10 / total_bytes_) : 10;
    if (decile == last_decile_) return;
    last_decile_ = decile;
  }
  last_draw_ = now;
  draw(false);
}

void Progress::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  if (!terminal_ && last_decile_ == 10) return;  // the 100% line is already out
  draw(true);
}

void Progress::draw(bool final_line) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = seconds > 0 ? double(done_bytes_) / seconds : 0.0;
  const double percent = total_bytes_ ? 100.0 * double(done_bytes_) / double(total_bytes_) : 100.0;
  std::string line = fmt::format("{}: {:5.1f}% {} / {}, {}/s, {:.1f} s", label_, percent,
                                 format_bytes(done_bytes_), format_bytes(total_bytes_),
                                 format_bytes(uint64_t(rate)), seconds);
  if (terminal_)
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final_line ? "\n" : "");
  else
    std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace tandem
