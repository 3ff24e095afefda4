#pragma once
// What a model is made of, for placement: every weight group with its bytes in its stored format,
// plus the KV cache and work buffers it needs. Built from GGUF headers alone (no weight is read)
// or from a built-in shape preset, so plans can be made for models that are not on this machine.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "model/model.h"
#include "model/model_shapes.h"
#include "model/weight_groups.h"

namespace tandem {
namespace gguf {
class GgufFile;
}

namespace plan {

// The unit of placement: per layer its attention (with its norms), router, shared experts,
// dense FFN, and each routed expert on its own; plus the embeddings and the output head (with
// the final norm). MTP layers are not listed (inference skips them).
struct InventoryGroup {
  WeightGroup kind = WeightGroup::Other;
  int32_t layer = -1;   // -1 outside the blocks
  int32_t expert = -1;  // routed experts: index within the layer
  uint64_t bytes = 0;
  uint64_t interleaved_bytes = 0;  // of `bytes`, in tandem's interleaved formats (tandem repack)
  // What the host's decode kernels spend on its formats beyond Q4_K's cost per byte, as bytes:
  // Σ bytes * (host_kernel_cost_per_byte - 1). Zero but for the grid i-quants.
  uint64_t host_kernel_extra_bytes = 0;
  // The first of its formats the CUDA backend cannot multiply (cuda_reads), or nullopt: a group
  // with one stays off CUDA devices.
  std::optional<DType> not_on_cuda;

  // "token_embd", "output", "blk.3.attention", "blk.3.router", "blk.3.shared_experts",
  // "blk.0.dense_ffn", "blk.3.expert.17".
  std::string label() const;
};

struct ModelInventory {
  std::string name;        // file name or preset name
  std::string quant_mix;   // "Q4_K_M", "Q8_0", ... (from general.file_type or the preset)
  ModelInfo info;          // the architecture's numbers (model/model.h)
  uint32_t n_layers = 0;  // layers that run (MTP excluded)
  std::vector<InventoryGroup> groups;
  // Tensors no group holds because inference never reads them (MTP layers, unknown names).
  uint64_t skipped_bytes = 0;

  // KV cache bytes of layer l for `n_ctx` positions of one sequence: rows of `cache_type` values
  // as the architecture shapes them (latent or keys and values); a sliding-window layer keeps
  // its ring only.
  uint64_t kv_layer_bytes(uint32_t layer, int64_t n_ctx, DType cache_type) const;

  uint64_t total_weight_bytes() const;
  // Bytes every decode token reads: everything but the routed experts, plus the experts a token
  // actually uses (n_expert_used per MoE layer at the average expert size). The embedding table
  // counts one row: a lookup reads only that.
  uint64_t bytes_read_per_token() const;
  // Of those, the bytes stored in interleaved formats (read by faster kernels).
  uint64_t interleaved_bytes_read_per_token() const;
  // Σ host_kernel_extra_bytes over the same groups.
  uint64_t host_kernel_extra_bytes_read_per_token() const;
  // Activation buffers a device needs to run `n_tokens` tokens of one step.
  uint64_t work_buffer_bytes(int64_t n_tokens) const;
};

// The host's one-token kernel time per byte of a format, relative to Q4_K's (the rate
// kernel_rate.h measures): 1 but for the grid i-quants, whose kernels spend more instructions per
// byte (decode on a few cores is bound by them, not by memory).
double host_kernel_cost_per_byte(DType type);

// Whether the CUDA backend multiplies weights of this format: those with a block decoder
// (quant/block_decode.h), interleaved ones through their base format (taken apart on upload).
// Today every format tandem reads; a new format's CPU kernels may land before its GPU ones.
bool cuda_reads(DType type);

// From the headers of all parts of a (possibly split) GGUF file; no tensor data is touched.
ModelInventory inventory_from_file(const gguf::GgufFile& file);

// From a model's shape through its tensor layout (what a file of that mix would hold); `name` is
// the inventory's name. Presets are built with it; tests compare it with files.
ModelInventory inventory_from_shape(std::string name, const ModelShape& shape,
                                    std::string_view quant_mix);

// The real models' shapes (model/model_shapes.h: DeepSeek V2/V3/R1, Kimi-K2, Qwen3-30B-A3B,
// 235B-A22B and Coder-480B, gpt-oss-20b/120b, GLM-4.5/4.6/Air) in a quantization mix
// (model/tensor_layout.h). Errors list the names.
ModelInventory inventory_from_preset(std::string_view preset, std::string_view quant_mix);
const std::vector<std::string>& inventory_preset_names();
const std::vector<std::string>& inventory_quant_mixes();

}  // namespace plan
}  // namespace tandem
