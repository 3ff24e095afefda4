#pragma once
// Which weight group a deepseek2 tensor belongs to, from its GGUF name. Weight groups are the
// unit of placement (DESIGN.md "Placement"); `inspect` sums bytes per group with this too.
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

enum class WeightGroup {
  Embedding,      // token_embd
  OutputHead,     // output (the LM head)
  Norms,          // every *_norm vector
  Attention,      // attn_q*, attn_kv_a_mqa, attn_k_b, attn_v_b, attn_kv_b, attn_output
  Router,         // ffn_gate_inp, exp_probs_b
  SharedExperts,  // ffn_*_shexp
  RoutedExperts,  // ffn_*_exps
  DenseFfn,       // ffn_gate / ffn_up / ffn_down of the leading dense layers
  NextN,          // V3 multi-token-prediction layers (nextn.*, or blocks past the main stack)
  Other,
};
inline constexpr int kWeightGroupCount = int(WeightGroup::Other) + 1;

std::string_view weight_group_name(WeightGroup group);

struct TensorRole {
  WeightGroup group;
  std::optional<uint32_t> layer;  // blk.N tensors
};

// `n_main_layers`: blocks at or past it are MTP layers (V3 files append them to blk.*).
TensorRole classify_tensor(std::string_view name, uint32_t n_main_layers);

namespace gguf {
class GgufFile;
}

// Bytes and tensor counts of a file per weight group and per stored format.
struct WeightBytes {
  std::array<uint64_t, kWeightGroupCount> group_bytes{};
  std::array<uint64_t, kWeightGroupCount> group_tensors{};
  std::map<std::string, uint64_t> format_bytes;  // "Q4_K" -> bytes
  std::map<std::string, uint64_t> format_tensors;
  uint64_t total_bytes = 0;
};
WeightBytes count_weight_bytes(const gguf::GgufFile& file, uint32_t n_main_layers);

}  // namespace tandem
