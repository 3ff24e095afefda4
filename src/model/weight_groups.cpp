#include "model/weight_groups.h"

#include <charconv>

#include "gguf/gguf_file.h"

namespace tandem {
namespace {

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }
bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

}  // namespace

std::string_view weight_group_name(WeightGroup group) {
  switch (group) {
    case WeightGroup::Embedding: return "embeddings";
    case WeightGroup::OutputHead: return "output head";
    case WeightGroup::Norms: return "norms";
    case WeightGroup::Attention: return "attention";
    case WeightGroup::Router: return "router";
    case WeightGroup::SharedExperts: return "shared experts";
    case WeightGroup::RoutedExperts: return "routed experts";
    case WeightGroup::DenseFfn: return "dense ffn";
    case WeightGroup::NextN: return "mtp (skipped)";
    case WeightGroup::Other: return "other";
  }
  return "other";
}

TensorRole classify_tensor(std::string_view name, uint32_t n_main_layers) {
  if (starts_with(name, "token_embd.")) return {WeightGroup::Embedding, std::nullopt};
  if (starts_with(name, "output_norm.")) return {WeightGroup::Norms, std::nullopt};
  if (starts_with(name, "output.")) return {WeightGroup::OutputHead, std::nullopt};
  if (!starts_with(name, "blk.")) return {WeightGroup::Other, std::nullopt};

  const std::string_view rest = name.substr(4);
  uint32_t layer = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), layer);
  if (ec != std::errc() || end == rest.data() + rest.size() || *end != '.')
    return {WeightGroup::Other, std::nullopt};
  const std::string_view leaf(end + 1, size_t(rest.data() + rest.size() - (end + 1)));

  WeightGroup group = WeightGroup::Other;
  if (layer >= n_main_layers || starts_with(leaf, "nextn.")) group = WeightGroup::NextN;
  else if (contains(leaf, "_norm.")) group = WeightGroup::Norms;
  else if (starts_with(leaf, "attn_")) group = WeightGroup::Attention;
  else if (starts_with(leaf, "ffn_gate_inp.") || starts_with(leaf, "exp_probs_b")) group = WeightGroup::Router;
  else if (contains(leaf, "_shexp.")) group = WeightGroup::SharedExperts;
  else if (contains(leaf, "_exps.")) group = WeightGroup::RoutedExperts;
  else if (starts_with(leaf, "ffn_gate.") || starts_with(leaf, "ffn_up.") || starts_with(leaf, "ffn_down."))
    group = WeightGroup::DenseFfn;
  return {group, layer};
}

WeightBytes count_weight_bytes(const gguf::GgufFile& file, uint32_t n_main_layers) {
  WeightBytes bytes;
  for (const gguf::TensorInfo& tensor : file.tensors()) {
    const int group = int(classify_tensor(tensor.name, n_main_layers).group);
    bytes.group_bytes[size_t(group)] += tensor.n_bytes;
    bytes.group_tensors[size_t(group)] += 1;
    const std::string format(dtype_name(tensor.type));
    bytes.format_bytes[format] += tensor.n_bytes;
    bytes.format_tensors[format] += 1;
    bytes.total_bytes += tensor.n_bytes;
  }
  return bytes;
}

}  // namespace tandem
