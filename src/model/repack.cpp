#include "model/repack.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <regex>
#include <vector>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/progress.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "quant/interleave.h"

namespace tandem {
namespace {

constexpr int64_t kGroupRows = 16;
// Metadata key that marks a repacked file (and says what was done, for `tandem inspect`), and
// the one that records what it was made from, for --repack's cache: this layout's version and
// the source's header fingerprint (a copy by another layout, or of another file, is made again).
constexpr std::string_view kRepackedKey = "tandem.repacked";
constexpr std::string_view kSourceKey = "tandem.repacked.source";

std::string source_text(const gguf::GgufFile& file) {
  return fmt::format("r16v1:{:016x}", file.header_fingerprint());
}

// Where --repack keeps the copy of `model`: beside it, then the user's cache folder (there named
// with the source's fingerprint too: models of one name from different folders meet there).
std::vector<std::filesystem::path> copy_places(const std::filesystem::path& model,
                                               const std::string& source) {
  const std::string stem = model.stem().string();
  const std::string name = stem + ".tandem-r16.gguf";
  std::vector<std::filesystem::path> places = {
      model.parent_path().empty() ? std::filesystem::path(name) : model.parent_path() / name};
  std::filesystem::path cache;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    cache = xdg;
  else if (const char* home = std::getenv("HOME"); home && *home)
    cache = std::filesystem::path(home) / ".cache";
  if (!cache.empty())
    places.push_back(cache / "tandem" /
                     (stem + "-" + source.substr(source.size() - 8) + ".tandem-r16.gguf"));
  return places;
}

// An exclusive lock on a file (created if need be), held until destroyed: one run at a time makes
// a place's copy; the others wait for it and load it. The system drops it if the process dies.
class FileLock {
 public:
  explicit FileLock(const std::string& path)
      : fd_(::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644)) {
    if (fd_ < 0) fail("--repack: cannot open the lock file {}", path);
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) fail("--repack: cannot lock {}", path);
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

// Partial copies of `place` that a run killed while writing left behind (no writer holds the
// place's lock but the caller).
void remove_partial_copies(const std::filesystem::path& place) {
  std::error_code ec;
  const std::string prefix = place.filename().string() + ".partial-";
  const std::filesystem::path folder = place.parent_path().empty() ? "." : place.parent_path();
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec))
    if (entry.path().filename().string().starts_with(prefix))
      std::filesystem::remove(entry.path(), ec);
}

// `path` opened when it is a repacked copy of the file whose source_text is `source`, else null.
std::unique_ptr<gguf::GgufFile> open_copy_of(const std::filesystem::path& path,
                                             const std::string& source) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return nullptr;
  try {
    auto copy = std::make_unique<gguf::GgufFile>(gguf::GgufFile::open(path.string()));
    if (repacked_source(*copy) == source) return copy;
  } catch (const Error&) {
    // damaged or not a GGUF: made again
  }
  return nullptr;
}

bool interleaves(const gguf::TensorInfo& t) {
  if (!has_interleaved_format(t.type) || t.shape.size() < 2) return false;
  return is_repackable_matrix(t.name) && t.shape[1] % kGroupRows == 0;
}

// Split-file bookkeeping describes the input's parts, not the single output file.
bool copied_key(std::string_view key) {
  return !key.starts_with("split.") && key != kRepackedKey && key != kSourceKey;
}

}  // namespace

std::string repacked_source(const gguf::GgufFile& file) {
  return file.get_string_or(kSourceKey, "");
}

bool is_repackable_matrix(std::string_view name) {
  // Tensors used only as the weight of a matmul (the architectures bind them with
  // WeightBinder::matrix/matrices): deepseek2's MLA projections (attn_k_b and attn_v_b are one
  // matmul per head, each head's [512, 128] or [128, 512] matrix whole groups of 16 rows), the
  // grouped-query attention's attn_q/k/v/output, the FFNs and experts. Not token_embd (rows
  // looked up one at a time), not attn_kv_b (dequantized and split at load), not the router
  // (F32 anyway).
  static const std::regex matmul_weight(
      R"(output\.weight|blk\.\d+\.(attn_q|attn_k|attn_v|attn_q_a|attn_q_b|attn_kv_a_mqa|)"
      R"(attn_output|attn_k_b|attn_v_b|ffn_gate|ffn_up|ffn_down|ffn_(gate|up|down)_(exps|shexp))\.weight)");
  return std::regex_match(name.begin(), name.end(), matmul_weight);
}

RepackSummary repack_model(const RepackOptions& options, ThreadPool& pool) {
  const auto start = std::chrono::steady_clock::now();
  const gguf::GgufFile in = gguf::GgufFile::open(options.input_path);
  if (in.find(kRepackedKey))
    fail("{}: already repacked ({} is set); repack the original file instead", in.name(),
         kRepackedKey);

  gguf::GgufWriter out =
      options.memory.empty()
          ? gguf::GgufWriter(options.output_path, in.alignment())
          : gguf::GgufWriter(options.memory, options.output_path, in.alignment());
  for (const auto& [key, value] : in.metadata())
    if (copied_key(key)) out.add_metadata(key, value);
  out.add_metadata(std::string(kRepackedKey),
                   gguf::Value::string("Q8_0, Q5_0 and Q4_K matrices with 16 rows "
                                       "interleaved (*_R16) for the CPU decode kernels"));
  out.add_metadata(std::string(kSourceKey), gguf::Value::string(source_text(in)));
  RepackSummary summary;
  uint64_t total_bytes = 0;
  std::vector<bool> interleave_tensor;  // [tensor], decided once for the header and the data
  for (const gguf::TensorInfo& t : in.tensors()) {
    const bool interleave = interleave_tensor.emplace_back(interleaves(t));
    out.add_tensor(t.name, interleave ? interleaved_format(t.type) : t.type, t.shape);
    total_bytes += t.n_bytes;
    summary.n_tensors += 1;
    summary.n_interleaved += interleave ? 1 : 0;
    summary.interleaved_bytes += interleave ? t.n_bytes : 0;
  }
  out.write_header();

  Progress progress("repacking " + options.output_path, total_bytes, options.show_progress);
  std::vector<uint8_t> converted;
  for (size_t i = 0; i < in.tensors().size(); ++i) {
    const gguf::TensorInfo& t = in.tensors()[i];
    if (!interleave_tensor[i]) {
      // Pieces of 64 MiB, so the progress line moves while a big tensor is copied.
      for (uint64_t done = 0; done < t.n_bytes;) {
        const uint64_t n = std::min<uint64_t>(t.n_bytes - done, uint64_t(64) << 20);
        out.write_tensor_data(t.name, t.bytes().subspan(done, n));
        done += n;
        progress.advance(n);
      }
      continue;
    }
    const DType type = interleaved_format(t.type);
    const int64_t cols = int64_t(t.shape[0]);
    const uint64_t in_group_bytes = kGroupRows * row_bytes(t.type, uint64_t(cols));
    const uint64_t out_group_bytes = kGroupRows * row_bytes(type, uint64_t(cols));
    const int64_t n_groups = int64_t(t.n_elements / uint64_t(cols) / kGroupRows);
    // About 16 MiB of groups per piece, converted by all threads.
    const int64_t per_piece = std::max<int64_t>(1, int64_t((uint64_t(16) << 20) / in_group_bytes));
    for (int64_t first = 0; first < n_groups; first += per_piece) {
      const int64_t n = std::min(per_piece, n_groups - first);
      converted.resize(size_t(n) * out_group_bytes);
      pool.parallel_for(n, [&](int64_t g, int) {
        interleave_rows(type, t.data + uint64_t(first + g) * in_group_bytes, cols,
                        converted.data() + uint64_t(g) * out_group_bytes);
      });
      out.write_tensor_data(t.name, converted);
      progress.advance(uint64_t(n) * in_group_bytes);
    }
  }
  out.finish();
  progress.finish();
  if (options.memory.empty()) {
    // Written pages stay cached in the small pieces write() made them in, which a mapping can
    // only enter 4 KiB at a time: a quarter of the lite model's copy was read that way (the rest
    // on 2 MiB pages), and such pages stream 15-20% slower on this project's VM. Written back and
    // dropped now (1.4 s for lite's 9.8 GiB), the copy is read back on first use in the 2 MiB
    // pages the loader asks for: 98% of it on 2 MiB pages then.
    drop_written_pages(options.output_path);
  }
  summary.file_bytes = out.bytes_written();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

RepackedCopy repacked_copy(const gguf::GgufFile& model, int n_threads, bool show_progress) {
  const std::string& model_path = model.name();
  if (model.find(kRepackedKey)) return {};
  const std::string source = source_text(model);
  const std::vector<std::filesystem::path> places = copy_places(model_path, source);
  for (const std::filesystem::path& place : places)
    if (auto file = open_copy_of(place, source))
      return {.path = place.string(), .file = std::move(file)};
  // About the model's size (Q4_K matrices grow 2.8%), and some room left over.
  const uint64_t need =
      model.total_file_bytes() + model.total_file_bytes() / 20 + (uint64_t(1) << 30);
  std::vector<std::string> refused;
  bool short_of_space = false;
  for (const std::filesystem::path& place : places) {
    std::error_code ec;
    const std::filesystem::path folder = place.parent_path().empty() ? "." : place.parent_path();
    std::filesystem::create_directories(folder, ec);
    if (::access(folder.c_str(), W_OK) != 0) {
      refused.push_back(fmt::format("{} is not writable", folder.string()));
      continue;
    }
    // One run at a time per place: a rank on the same machine that comes second finds the copy
    // made. Written under a name of this process's own, then renamed in one step.
    const FileLock lock(place.string() + ".lock");
    if (auto file = open_copy_of(place, source))
      return {.path = place.string(), .file = std::move(file)};
    remove_partial_copies(place);
    const std::filesystem::space_info space = std::filesystem::space(folder, ec);
    if (!ec && space.available < need) {
      refused.push_back(fmt::format("{} has {} free, the copy needs about {}", folder.string(),
                                    format_bytes(space.available), format_bytes(need)));
      short_of_space = true;
      continue;
    }
    const std::string partial = fmt::format("{}.partial-{}", place.string(), ::getpid());
    RepackedCopy copy{.path = place.string(), .made = true};
    ThreadPool pool(n_threads);
    copy.summary = repack_model(
        {.input_path = model_path, .output_path = partial, .show_progress = show_progress}, pool);
    std::filesystem::rename(partial, place, ec);
    if (ec) {
      std::filesystem::remove(partial, ec);
      fail("--repack: cannot move the copy into place as {}: {}", place.string(), ec.message());
    }
    copy.file = std::make_unique<gguf::GgufFile>(gguf::GgufFile::open(copy.path));
    return copy;
  }
  fail(
      "--repack: no place for the repacked copy of {} ({}); {}, or repack it yourself with "
      "`tandem repack {} OUT.gguf` and run OUT.gguf",
      model_path, fmt::join(refused, "; "),
      short_of_space ? "free some space" : "make the model's folder writable", model_path);
}

RepackedCopy repacked_in_memory(const gguf::GgufFile& model, int n_threads, bool show_progress) {
  if (model.find(kRepackedKey)) return {};
  // Room for the copy: Q4_K matrices grow by 2.8%, the header by a few keys. Pages are committed
  // as the image is written, so what is left over costs address space only.
  const uint64_t room =
      model.total_file_bytes() + model.total_file_bytes() / 20 + (uint64_t(64) << 20);
  RepackedCopy copy{.path = model.name() + " (repacked in memory)",
                    .memory = std::make_unique<AlignedBuffer>(size_t(room)),
                    .made = true};
  ThreadPool pool(n_threads);
  copy.summary = repack_model({.input_path = model.name(),
                               .output_path = copy.path,
                               .show_progress = show_progress,
                               .memory = {copy.memory->data(), copy.memory->size()}},
                              pool);
  copy.file = std::make_unique<gguf::GgufFile>(gguf::GgufFile::parse_memory(
      {copy.memory->data(), size_t(copy.summary.file_bytes)}, copy.path));
  return copy;
}

}  // namespace tandem
