#include "plan/inventory.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <map>
#include <tuple>

#include "core/error.h"
#include "gguf/gguf_file.h"
#include "model/model_shapes.h"
#include "quant/block_decode.h"

namespace tandem::plan {
namespace {

// One tensor as the grouping needs it, whether it comes from a file or from a layout.
struct TensorBytes {
  std::string_view name;
  const std::vector<uint64_t>* shape;
  uint64_t bytes;
  DType type = DType::F32;
};

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// Where a per-layer norm goes: attention norms with the attention; ffn_norm with the FFN whose
// input it normalizes. In an MoE layer that is the router's group: the router, the shared experts
// and every routed expert all read the normed input, and the router always exists and lives with
// the layer (placement puts it on the layer's device), so the norm is computed where the
// activations already are. In a dense layer it is the dense FFN's.
WeightGroup norm_owner(std::string_view name, uint32_t layer, const ModelInfo& info) {
  const std::string_view leaf = name.substr(name.find('.', 4) + 1);  // after "blk.N."
  // The pre-FFN norm: ffn_norm, or post_attention_norm (gpt-oss, GLM: after the attention's
  // residual add, before the FFN).
  if (starts_with(leaf, "ffn_norm") || starts_with(leaf, "post_attention_norm"))
    return info.is_moe_layer(layer) ? WeightGroup::Router : WeightGroup::DenseFfn;
  return WeightGroup::Attention;
}

// The order groups are listed in within a layer.
int rank_in_layer(WeightGroup kind) {
  switch (kind) {
    case WeightGroup::Attention:
      return 0;
    case WeightGroup::Router:
    case WeightGroup::DenseFfn:
      return 1;
    case WeightGroup::SharedExperts:
      return 2;
    default:
      return 3;
  }
}

ModelInventory build_inventory(std::string name, std::string quant_mix, const ModelInfo& info,
                               const std::vector<TensorBytes>& tensors) {
  ModelInventory inv;
  inv.name = std::move(name);
  inv.quant_mix = std::move(quant_mix);
  inv.info = info;
  inv.n_layers = info.n_layer;

  // (sort position, rank in layer, expert) -> group; the embeddings sort first, the head last.
  std::map<std::tuple<int64_t, int, int32_t>, InventoryGroup> groups;
  DType type = DType::F32;  // of the tensor being added
  auto add = [&](WeightGroup kind, int32_t layer, int32_t expert, uint64_t bytes) {
    const int64_t position = kind == WeightGroup::Embedding    ? -1
                             : kind == WeightGroup::OutputHead ? int64_t(INT32_MAX)
                                                               : int64_t(layer);
    InventoryGroup& group = groups[{position, rank_in_layer(kind), expert}];
    group.kind = kind, group.layer = layer, group.expert = expert;
    group.bytes += bytes;
    group.interleaved_bytes += is_interleaved(type) ? bytes : 0;
    if (!group.not_on_cuda && !cuda_reads(type)) group.not_on_cuda = type;
    group.host_kernel_extra_bytes += uint64_t(double(bytes) * (host_kernel_cost_per_byte(type) - 1));
  };

  for (const TensorBytes& t : tensors) {
    type = t.type;
    const TensorRole role = classify_tensor(t.name, inv.n_layers);
    const int32_t layer = role.layer ? int32_t(*role.layer) : -1;
    switch (role.group) {
      case WeightGroup::Embedding:
        add(WeightGroup::Embedding, -1, -1, t.bytes);
        break;
      case WeightGroup::OutputHead:
        add(WeightGroup::OutputHead, -1, -1, t.bytes);
        break;
      case WeightGroup::Norms:
        if (layer < 0)
          add(WeightGroup::OutputHead, -1, -1, t.bytes);  // output_norm
        else
          add(norm_owner(t.name, uint32_t(layer), info), layer, -1, t.bytes);
        break;
      case WeightGroup::Attention:
      case WeightGroup::Router:
      case WeightGroup::SharedExperts:
      case WeightGroup::DenseFfn:
        add(role.group, layer, -1, t.bytes);
        break;
      case WeightGroup::RoutedExperts: {
        // [row, rows per expert, n_expert] (or [row, n_expert] for per-expert biases): expert e
        // is the e-th equal slab of the tensor.
        const auto& shape = *t.shape;
        const uint32_t n_exp = info.n_expert;
        if (shape.size() < 2 || shape.back() != n_exp || t.bytes % n_exp != 0)
          fail(
              "{}: expected a tensor of {} experts (its last dimension), found shape [{}]; the "
              "file "
              "does not match its {}.expert_count",
              t.name, n_exp, fmt::join(shape, ", "), info.arch);
        for (uint32_t e = 0; e < n_exp; ++e)
          add(WeightGroup::RoutedExperts, layer, int32_t(e), t.bytes / n_exp);
        break;
      }
      case WeightGroup::NextN:
      case WeightGroup::Other:
        inv.skipped_bytes += t.bytes;
        break;
    }
  }
  inv.groups.reserve(groups.size());
  for (auto& [key, group] : groups) inv.groups.push_back(group);
  return inv;
}

std::string quant_mix_of(const gguf::GgufFile& file) {
  // general.file_type as llama.cpp numbers its ftypes.
  switch (file.get_int_or("general.file_type", -1)) {
    case 0:
      return "F32";
    case 1:
      return "F16";
    case 7:
      return "Q8_0";
    case 10:
      return "Q2_K";
    case 15:
      return "Q4_K_M";
    case 30:
      return "IQ4_XS";
    case 32:
      return "BF16";
    case 38:
      return "MXFP4_MOE";
    default:
      return "mixed";
  }
}

}  // namespace

std::string InventoryGroup::label() const {
  switch (kind) {
    case WeightGroup::Embedding:
      return "token_embd";
    case WeightGroup::OutputHead:
      return "output";
    case WeightGroup::Attention:
      return fmt::format("blk.{}.attention", layer);
    case WeightGroup::Router:
      return fmt::format("blk.{}.router", layer);
    case WeightGroup::SharedExperts:
      return fmt::format("blk.{}.shared_experts", layer);
    case WeightGroup::DenseFfn:
      return fmt::format("blk.{}.dense_ffn", layer);
    case WeightGroup::RoutedExperts:
      return fmt::format("blk.{}.expert.{}", layer, expert);
    default:
      return fmt::format("blk.{}.other", layer);
  }
}

uint64_t ModelInventory::total_weight_bytes() const {
  uint64_t total = 0;
  for (const InventoryGroup& group : groups) total += group.bytes;
  return total;
}

namespace {

// Σ over the groups a decode token reads of `field` (bytes_read_per_token says which).
uint64_t read_per_token(const ModelInventory& inv, uint64_t InventoryGroup::*field) {
  uint64_t bytes = 0;
  std::map<int32_t, std::pair<uint64_t, uint64_t>> experts;  // layer -> (bytes, count)
  for (const InventoryGroup& group : inv.groups) {
    if (group.kind == WeightGroup::RoutedExperts) {
      experts[group.layer].first += group.*field;
      experts[group.layer].second += 1;
    } else if (group.kind == WeightGroup::Embedding) {
      bytes += inv.info.n_vocab > 0 ? group.*field / inv.info.n_vocab : group.*field;
    } else {
      bytes += group.*field;
    }
  }
  for (const auto& [layer, sum] : experts)
    bytes += sum.first / sum.second * std::min<uint64_t>(inv.info.n_expert_used, sum.second);
  return bytes;
}

}  // namespace

uint64_t ModelInventory::bytes_read_per_token() const {
  return read_per_token(*this, &InventoryGroup::bytes);
}

uint64_t ModelInventory::interleaved_bytes_read_per_token() const {
  return read_per_token(*this, &InventoryGroup::interleaved_bytes);
}

uint64_t ModelInventory::host_kernel_extra_bytes_read_per_token() const {
  return read_per_token(*this, &InventoryGroup::host_kernel_extra_bytes);
}

// F32 activations of one layer for `n_tokens` tokens, all alive at once (an upper bound: the
// executor reuses them from layer to layer), plus the logits rows. Per token, in values:
//   residual + normed input                         2 * n_embd
//   attention's buffers                             ModelInfo::attention_buffer_floats (scores
//                                                   in tiles: context length does not enter)
//   router logits                                   n_expert
//   FFN gate and up                                 2 * max(n_ff_dense, used * n_ff_expert +
//   shared) FFN output                                      n_embd logits n_vocab
// times 4 bytes, plus an int8-quantized copy of the widest matmul input (34 bytes per 32 values).
uint64_t ModelInventory::work_buffer_bytes(int64_t n_tokens) const {
  const ModelInfo& m = info;
  const uint64_t moe_ff =
      uint64_t(m.n_expert_used) * m.n_ff_expert + uint64_t(m.n_expert_shared) * m.n_ff_expert;
  const uint64_t ff = std::max<uint64_t>(m.n_ff_dense, moe_ff);
  const uint64_t values = 2 * uint64_t(m.n_embd) + m.attention_buffer_floats + m.n_expert + 2 * ff +
                          m.n_embd + m.n_vocab;
  const uint64_t widest_input = std::max<uint64_t>({m.n_embd, m.attention_output_dims, ff});
  const uint64_t per_token = values * sizeof(float) + widest_input * 34 / 32;
  return uint64_t(std::max<int64_t>(n_tokens, 0)) * per_token;
}

uint64_t ModelInventory::kv_layer_bytes(uint32_t layer, int64_t n_ctx, DType cache_type) const {
  const KvLayerShape& shape = info.kv[layer];
  // A window layer holds its window and one step (runtime/kv_cache.h: 512 tokens).
  constexpr int64_t kStepTokens = 512;
  const int64_t rows = shape.window > 0 ? std::min(n_ctx, shape.window + kStepTokens) : n_ctx;
  return uint64_t(std::max<int64_t>(rows, 0)) * row_bytes(cache_type, uint64_t(shape.row_floats()));
}

double host_kernel_cost_per_byte(DType type) {
  // matmul_bench, 1408x2048, 2 threads, weights from DRAM, 8-bit activations, on the 2-core
  // Zen 5 development host, one run (2026-12-05): Q4_K 35.1 GB/s; IQ2_XXS 15.2 and IQ3_XXS
  // 21.0 (grids in registers), IQ2_S 8.9, IQ3_S 8.0, IQ2_XS 5.5, IQ1_S 4.6, IQ1_M 2.9 (grid
  // words loaded 8 weights at a time). Other formats are within ~25% of Q4_K and count as it.
  switch (type) {
    case DType::IQ2_XXS:
      return 2.3;
    case DType::IQ3_XXS:
      return 1.7;
    case DType::IQ2_S:
      return 3.95;
    case DType::IQ3_S:
      return 4.4;
    case DType::IQ2_XS:
      return 6.4;
    case DType::IQ1_S:
      return 7.6;
    case DType::IQ1_M:
      return 12.2;
    default:
      return 1.0;
  }
}

bool cuda_reads(DType type) {
  return blocks::has_block_decoder(is_interleaved(type) ? dtype_info(type).base : type);
}

ModelInventory inventory_from_file(const gguf::GgufFile& file) {
  const ModelInfo info = read_model_info(file);
  std::vector<TensorBytes> tensors;
  tensors.reserve(file.tensors().size());
  for (const gguf::TensorInfo& t : file.tensors())
    tensors.push_back({t.name, &t.shape, t.n_bytes, t.type});
  return build_inventory(std::filesystem::path(file.name()).filename().string(), quant_mix_of(file),
                         info, tensors);
}

ModelInventory inventory_from_shape(std::string name, const ModelShape& shape,
                                    std::string_view quant_mix) {
  const std::vector<TensorLayout> layout = shape.layout(quant_mix);
  std::vector<TensorBytes> tensors;
  tensors.reserve(layout.size());
  for (const TensorLayout& t : layout) tensors.push_back({t.name, &t.shape, t.n_bytes(), t.type});
  return build_inventory(std::move(name), std::string(quant_mix), shape.info(), tensors);
}

ModelInventory inventory_from_preset(std::string_view preset, std::string_view quant_mix) {
  return inventory_from_shape(std::string(preset), model_shape(preset), quant_mix);
}

const std::vector<std::string>& inventory_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const ModelShapeName& n : model_shape_names()) out.push_back(n.name);
    return out;
  }();
  return names;
}

const std::vector<std::string>& inventory_quant_mixes() {
  return quant_mixes();
}

}  // namespace tandem::plan
