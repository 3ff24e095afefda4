#include "model/deepseek2_layout.h"

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
               uint32_t n_layer) {
  if (mix == "F32") return DType::F32;
  if (mix == "F16") return DType::F16;
  if (mix == "BF16") return DType::BF16;
  if (mix == "Q8_0") return DType::Q8_0;
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
    // llama.cpp gives more bits to ffn_down only (attn_v_b is not its "attn_v"; the fixtures'
    // Q4_K_M files confirm both: Q6_K ffn_down in layers 2-3 of 4, attn_v_b never raised).
    if (down && role.layer && q4_k_m_layer_gets_more_bits(*role.layer, n_layer)) return DType::Q6_K;
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
                  uint32_t n_layer) {
  const TensorRole role = classify_tensor(name, n_layer);
  // Vectors, the router and the selection bias stay F32 in every mix: they are tiny and the
  // routing decision is sensitive to them.
  if (shape.size() == 1 || role.group == WeightGroup::Router) return DType::F32;
  return fallback_for_row(mix_type(mix, name, role, n_layer), shape[0]);
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

const std::vector<std::string>& deepseek2_quant_mixes() {
  static const std::vector<std::string> mixes = {
      "Q4_K_M",     "Q8_0", "BF16",  "F16",   "F32",  "Q2_K", "IQ4_XS", "UD-IQ1_S",
      "UD-IQ2_XXS", "Q4_1", "TQ1_0", "TQ2_0", "MXFP4", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS",
      "IQ2_S",      "IQ3_XXS", "IQ3_S"};
  return mixes;
}

bool is_bench_only_mix(std::string_view mix) {
  for (const char* bench : {"Q4_1", "TQ1_0", "TQ2_0", "MXFP4", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS",
                            "IQ2_S", "IQ3_XXS", "IQ3_S"})
    if (mix == bench) return true;
  return false;
}

bool q4_k_m_layer_gets_more_bits(uint32_t layer, uint32_t n_layer) {
  const uint32_t eighth = n_layer / 8;
  return layer < eighth || layer >= 7 * n_layer / 8 || (layer - eighth) % 3 == 2;
}

std::vector<TensorLayout> deepseek2_layout(const Deepseek2Hparams& hp, std::string_view quant_mix) {
  const auto& mixes = deepseek2_quant_mixes();
  if (std::find(mixes.begin(), mixes.end(), quant_mix) == mixes.end())
    fail("unknown quantization mix '{}'; known mixes: {}", quant_mix, fmt::join(mixes, ", "));
  TANDEM_CHECK(hp.n_vocab > 0 && hp.n_layer > hp.n_nextn_layers);

  std::vector<TensorLayout> tensors;
  auto matrix = [&](std::string name, std::vector<uint64_t> shape) {
    const DType type = choose_type(quant_mix, name, shape, hp.n_layer);
    tensors.push_back({std::move(name), std::move(shape), type});
  };
  auto vector = [&](std::string name, uint64_t n) {
    tensors.push_back({std::move(name), {n}, DType::F32});
  };

  const uint64_t embd = hp.n_embd, heads = hp.n_head, q_dim = heads * hp.qk_head_dim();
  matrix("token_embd.weight", {embd, hp.n_vocab});
  for (uint32_t il = 0; il < hp.n_layer - hp.n_nextn_layers; ++il) {
    const std::string blk = fmt::format("blk.{}.", il);
    vector(blk + "attn_norm.weight", embd);
    if (hp.q_lora_rank > 0) {
      matrix(blk + "attn_q_a.weight", {embd, hp.q_lora_rank});
      vector(blk + "attn_q_a_norm.weight", hp.q_lora_rank);
      matrix(blk + "attn_q_b.weight", {hp.q_lora_rank, q_dim});
    } else {
      matrix(blk + "attn_q.weight", {embd, q_dim});  // V2-Lite: no query compression
    }
    // MLA as current converters store it: the shared latent + rope key, then per-head
    // absorbed key and value projections out of the latent.
    matrix(blk + "attn_kv_a_mqa.weight", {embd, hp.kv_cache_dims()});
    vector(blk + "attn_kv_a_norm.weight", hp.kv_lora_rank);
    matrix(blk + "attn_k_b.weight", {hp.qk_nope_dim, hp.kv_lora_rank, heads});
    matrix(blk + "attn_v_b.weight", {hp.kv_lora_rank, hp.v_head_dim, heads});
    matrix(blk + "attn_output.weight", {heads * hp.v_head_dim, embd});
    vector(blk + "ffn_norm.weight", embd);
    if (!hp.is_moe_layer(il)) {
      matrix(blk + "ffn_gate.weight", {embd, hp.n_ff_dense});
      matrix(blk + "ffn_up.weight", {embd, hp.n_ff_dense});
      matrix(blk + "ffn_down.weight", {hp.n_ff_dense, embd});
      continue;
    }
    const uint64_t ff = hp.n_ff_expert, n_exp = hp.n_expert, shared_ff = ff * hp.n_expert_shared;
    matrix(blk + "ffn_gate_inp.weight", {embd, n_exp});
    if (hp.gating == ExpertGating::Sigmoid) vector(blk + "exp_probs_b.bias", n_exp);
    matrix(blk + "ffn_gate_exps.weight", {embd, ff, n_exp});
    matrix(blk + "ffn_up_exps.weight", {embd, ff, n_exp});
    matrix(blk + "ffn_down_exps.weight", {ff, embd, n_exp});
    if (hp.n_expert_shared > 0) {
      matrix(blk + "ffn_gate_shexp.weight", {embd, shared_ff});
      matrix(blk + "ffn_up_shexp.weight", {embd, shared_ff});
      matrix(blk + "ffn_down_shexp.weight", {shared_ff, embd});
    }
  }
  vector("output_norm.weight", embd);
  matrix("output.weight", {embd, hp.n_vocab});
  return tensors;
}

}  // namespace tandem
