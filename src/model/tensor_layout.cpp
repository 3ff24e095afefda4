#include "model/tensor_layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"
#include "model/weight_groups.h"

namespace tandem {
namespace {

bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// The format a mix asks for before the row-length fallback.
DType mix_type(std::string_view mix, const std::string& name, const TensorRole& role,
               uint32_t n_layer, uint32_t n_expert) {
  if (mix == "F32") return DType::F32;
  if (mix == "F16") return DType::F16;
  if (mix == "BF16") return DType::BF16;
  if (mix == "Q8_0") return DType::Q8_0;
  if (mix == "MXFP4_MOE")
    return role.group == WeightGroup::RoutedExperts ? DType::MXFP4 : DType::Q8_0;
  if (role.group == WeightGroup::OutputHead) return DType::Q6_K;  // Q4_K_M and Q2_K alike
  // The formats gen-model writes for benches and tests of their kernels: every other matrix.
  if (mix == "Q4_1") return DType::Q4_1;
  if (mix == "TQ1_0") return DType::TQ1_0;
  if (mix == "TQ2_0") return DType::TQ2_0;
  if (mix == "MXFP4") return DType::MXFP4;
  for (const DType grid : {DType::IQ1_S, DType::IQ1_M, DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S,
                           DType::IQ3_XXS, DType::IQ3_S})
    if (mix == dtype_name(grid)) return grid;
  const bool down = contains(name, "ffn_down");
  if (mix == "Q4_K_M") {
    // llama.cpp gives more bits to ffn_down and attn_v (MLA's attn_v_b is not its "attn_v"; the
    // fixtures' Q4_K_M files confirm: Q6_K ffn_down in layers 2-3 of 4, attn_v_b never raised),
    // and with exactly 8 experts raises attn_k and attn_v to Q8_0 and attn_output to Q5_K.
    const bool attn_v = contains(name, ".attn_v.");
    if (n_expert == 8) {
      if (attn_v || contains(name, ".attn_k.")) return DType::Q8_0;
      if (contains(name, ".attn_output.")) return DType::Q5_K;
    }
    if ((down || attn_v) && role.layer && q4_k_m_layer_gets_more_bits(*role.layer, n_layer))
      return DType::Q6_K;
    return DType::Q4_K;
  }
  // IQ4_XS: every matrix in it, as llama.cpp's IQ4_XS files (rows not a multiple of 256 fall
  // back to IQ4_NL below).
  if (mix == "IQ4_XS") return DType::IQ4_XS;
  if (mix.starts_with("UD-")) {
    // The dynamic low-bit mixes: routed experts (nearly all of the bytes, each read by few
    // tokens) at 1.6-2.1 bits, ffn_down one step above gate/up; everything every token reads at
    // 4-6 bits.
    if (role.group == WeightGroup::RoutedExperts) {
      if (mix == "UD-IQ1_S") return down ? DType::IQ2_XXS : DType::IQ1_S;
      return down ? DType::IQ3_XXS : DType::IQ2_XXS;  // UD-IQ2_XXS
    }
    return down ? DType::Q6_K : DType::Q4_K;
  }
  // Q2_K: only the routed experts go below 4 bits.
  if (role.group == WeightGroup::RoutedExperts) return down ? DType::Q3_K : DType::Q2_K;
  return DType::Q4_K;
}

// Rows that are not whole blocks fall back to a format with 32-element blocks, then to F16.
DType fallback_for_row(DType type, uint64_t row) {
  const uint32_t block = dtype_info(type).block_elems;
  if (row % block == 0) return type;
  DType fallback = DType::F16;
  switch (type) {
    case DType::Q4_K:
      fallback = DType::Q5_0;
      break;
    case DType::Q5_K:
      fallback = DType::Q5_1;
      break;
    case DType::Q6_K:
      fallback = DType::Q8_0;
      break;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::TQ1_0:
    case DType::TQ2_0:
      fallback = DType::Q4_0;
      break;
    case DType::IQ1_S:
    case DType::IQ1_M:
    case DType::IQ2_XXS:
    case DType::IQ2_XS:
    case DType::IQ2_S:
    case DType::IQ3_XXS:
    case DType::IQ3_S:
    case DType::IQ4_XS:
      fallback = DType::IQ4_NL;
      break;
    default:
      break;
  }
  return row % dtype_info(fallback).block_elems == 0 ? fallback : DType::F16;
}

DType choose_type(std::string_view mix, const std::string& name, const std::vector<uint64_t>& shape,
                  uint32_t n_layer, uint32_t n_expert) {
  const TensorRole role = classify_tensor(name, n_layer);
  // Vectors, biases (per-expert ones are matrices), the router and the selection bias stay F32
  // in every mix: they are tiny and the routing decision is sensitive to them.
  if (shape.size() == 1 || name.ends_with(".bias") || role.group == WeightGroup::Router)
    return DType::F32;
  return fallback_for_row(mix_type(mix, name, role, n_layer, n_expert), shape[0]);
}

}  // namespace

uint64_t TensorLayout::n_rows() const {
  uint64_t rows = 1;
  for (size_t d = 1; d < shape.size(); ++d) rows *= shape[d];
  return rows;
}

uint64_t TensorLayout::n_bytes() const {
  return n_rows() * row_bytes(type, shape[0]);
}

const std::vector<std::string>& quant_mixes() {
  static const std::vector<std::string> mixes = {
      "Q4_K_M",   "Q8_0",       "BF16",      "F16",    "F32",   "Q2_K",    "IQ4_XS",
      "UD-IQ1_S", "UD-IQ2_XXS", "MXFP4_MOE", "Q4_1",   "TQ1_0", "TQ2_0",   "MXFP4",
      "IQ1_S",    "IQ1_M",      "IQ2_XXS",   "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"};
  return mixes;
}

void check_quant_mix(std::string_view mix) {
  const auto& mixes = quant_mixes();
  if (std::find(mixes.begin(), mixes.end(), mix) == mixes.end())
    fail("unknown quantization mix '{}'; known mixes: {}", mix, fmt::join(mixes, ", "));
}

LayoutBuilder::LayoutBuilder(std::string_view quant_mix, uint32_t n_layer, uint32_t n_expert)
    : mix_(quant_mix), n_layer_(n_layer), n_expert_(n_expert) {
  check_quant_mix(quant_mix);
}

void LayoutBuilder::matrix(std::string name, std::vector<uint64_t> shape) {
  const DType type = choose_type(mix_, name, shape, n_layer_, n_expert_);
  tensors_.push_back({std::move(name), std::move(shape), type});
}

void LayoutBuilder::vector(std::string name, uint64_t n) {
  tensors_.push_back({std::move(name), {n}, DType::F32});
}

bool is_bench_only_mix(std::string_view mix) {
  for (const char* bench : {"Q4_1", "TQ1_0", "TQ2_0", "MXFP4", "IQ1_S", "IQ1_M", "IQ2_XXS",
                            "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"})
    if (mix == bench) return true;
  return false;
}

bool q4_k_m_layer_gets_more_bits(uint32_t layer, uint32_t n_layer) {
  const uint32_t eighth = n_layer / 8;
  return layer < eighth || layer >= 7 * n_layer / 8 || (layer - eighth) % 3 == 2;
}

}  // namespace tandem
