#include "model/repack.h"

#include <algorithm>
#include <chrono>
#include <regex>
#include <vector>

#include "core/error.h"
#include "core/progress.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "quant/interleave.h"

namespace tandem {
namespace {

constexpr int64_t kGroupRows = 16;
// Metadata key that marks a repacked file (and says what was done, for `tandem inspect`).
constexpr std::string_view kRepackedKey = "tandem.repacked";

bool interleaves(const gguf::TensorInfo& t) {
  if (!has_interleaved_format(t.type) || t.shape.size() < 2) return false;
  return is_repackable_matrix(t.name) && t.shape[1] % kGroupRows == 0;
}

// Split-file bookkeeping describes the input's parts, not the single output file.
bool copied_key(std::string_view key) {
  return !key.starts_with("split.") && key != kRepackedKey;
}

}  // namespace

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

  gguf::GgufWriter out(options.output_path, in.alignment());
  for (const auto& [key, value] : in.metadata())
    if (copied_key(key)) out.add_metadata(key, value);
  out.add_metadata(std::string(kRepackedKey),
                   gguf::Value::string("Q8_0, Q5_0 and Q4_K matrices with 16 rows "
                                       "interleaved (*_R16) for the CPU decode kernels"));
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
  summary.file_bytes = out.bytes_written();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace tandem
