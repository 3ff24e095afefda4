#include "runtime/cold_start.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "core/background_reader.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/progress.h"

namespace tandem {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void drop_from_page_cache(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    const size_t left = evict_from_page_cache(path);
    if (left > std::filesystem::file_size(path) / 100)
      fail("{}: {} of it stays in the page cache after asking the kernel to drop it; another "
           "process maps it (a running tandem serve or run?) — stop it to measure a cold start",
           path, format_bytes(left));
  }
}

// The ranges of each part rounded out to the 2 MiB pieces weights are read by, sorted and merged.
std::vector<std::vector<gguf::FileRange>> merged_pieces(std::vector<gguf::FileRange> ranges,
                                                        const std::vector<MappedFile>& maps) {
  const uint64_t piece = MappedFile::kReadGranule;
  std::vector<std::vector<gguf::FileRange>> merged(maps.size());
  std::sort(ranges.begin(), ranges.end(), [](const gguf::FileRange& a, const gguf::FileRange& b) {
    return a.file_index != b.file_index ? a.file_index < b.file_index : a.offset < b.offset;
  });
  for (const gguf::FileRange& r : ranges) {
    TANDEM_CHECK(r.file_index < maps.size() && r.offset + r.bytes <= maps[r.file_index].size());
    const uint64_t start = r.offset / piece * piece;
    const uint64_t end = std::min<uint64_t>((r.offset + r.bytes + piece - 1) / piece * piece, maps[r.file_index].size());
    std::vector<gguf::FileRange>& part = merged[r.file_index];
    if (!part.empty() && start <= part.back().offset + part.back().bytes)
      part.back().bytes = std::max(part.back().bytes, end - part.back().offset);
    else
      part.push_back({r.file_index, start, end - start});
  }
  return merged;
}

// Reads `ranges` of each mapped part into memory, in file order, the way the engine reads
// (BackgroundReader's threads and pieces).
void read_ranges(const std::vector<MappedFile>& maps, const std::vector<std::vector<gguf::FileRange>>& ranges) {
  BackgroundReader reader;
  for (const auto& part : ranges)
    for (const gguf::FileRange& r : part) reader.start_reading(maps[r.file_index], r.offset, r.bytes, /*urgent=*/true);
  reader.wait_until_done();
}

}  // namespace

ColdStart measure_cold_start(const EngineOptions& options, std::span<const int32_t> prompt, int repetitions) {
  TANDEM_CHECK(repetitions >= 1);
  std::vector<std::string> paths = gguf::GgufFile::open(options.model_path).paths();
  ColdStart cold;
  cold.prompt_tokens = int64_t(prompt.size());
  // Load and first token; the Engine is gone (unmapped) afterwards so its pages can be dropped.
  auto first_token = [&](std::vector<gguf::FileRange>* touched, double* load_seconds) {
    const auto start = std::chrono::steady_clock::now();
    Engine engine(options);
    std::vector<float> logits;
    engine.evaluate(prompt, 0, 0, false, logits);
    const double seconds = seconds_since(start);
    if (touched) *touched = engine.touched_file_ranges();
    if (load_seconds) *load_seconds = engine.load_seconds();
    return seconds;
  };
  // Mapped afresh for each reading: pages mapped by this process could not be dropped.
  auto map_parts = [&] {
    std::vector<MappedFile> maps;
    for (const std::string& path : paths) maps.emplace_back(path);
    return maps;
  };
  std::vector<std::vector<gguf::FileRange>> merged;
  for (int rep = 0; rep < repetitions; ++rep) {
    drop_from_page_cache(paths);
    std::vector<gguf::FileRange> touched;
    double load_seconds = 0;
    cold.first_token_seconds.push_back(first_token(&touched, &load_seconds));
    cold.load_seconds.push_back(load_seconds);
    drop_from_page_cache(paths);
    const std::vector<MappedFile> maps = map_parts();
    if (rep == 0) {  // the same prompt touches the same bytes every time
      merged = merged_pieces(std::move(touched), maps);
      for (const auto& part : merged)
        for (const gguf::FileRange& r : part) cold.touched_bytes += r.bytes;
      for (const MappedFile& map : maps) cold.file_bytes += map.size();
    }
    const auto start = std::chrono::steady_clock::now();
    read_ranges(maps, merged);
    cold.read_seconds.push_back(seconds_since(start));
  }

  // The whole model back into the page cache for whatever is measured next, when it fits.
  const uint64_t free_bytes = uint64_t(::sysconf(_SC_AVPHYS_PAGES)) * uint64_t(::sysconf(_SC_PAGESIZE));
  if (cold.file_bytes > free_bytes / 10 * 9) return cold;
  const std::vector<MappedFile> maps = map_parts();
  std::vector<std::vector<gguf::FileRange>> whole(maps.size());
  for (uint32_t i = 0; i < maps.size(); ++i) whole[i].push_back({i, 0, maps[i].size()});
  read_ranges(maps, whole);
  cold.warm_first_token_seconds = first_token(nullptr, nullptr);
  return cold;
}

}  // namespace tandem
