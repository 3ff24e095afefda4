#pragma once
// The tensor list of a model as converters and quantizers write it: every tensor's name, shape and
// stored format, computed from an architecture's hyperparameters and a quantization mix. gen-model
// writes exactly this list; the planner sizes models that are not on this machine with it, so a
// preset's bytes are the bytes a file of that mix would hold. Each architecture file lists its
// tensors with a LayoutBuilder; the formats follow the mix rules here, by tensor name.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace tandem {

struct TensorLayout {
  std::string name;             // "blk.3.ffn_down_exps.weight"
  std::vector<uint64_t> shape;  // GGUF order: shape[0] is the row length
  DType type = DType::F32;

  uint64_t n_rows() const;   // product of shape[1..]
  uint64_t n_bytes() const;  // n_rows() rows of shape[0] elements in `type`
};

// The mixes layouts know: "Q4_K_M", "Q8_0", "BF16", "F16", "F32", "Q2_K", "IQ4_XS",
// "UD-IQ1_S", "UD-IQ2_XXS", "MXFP4_MOE", "Q4_1", "TQ1_0", "TQ2_0", "MXFP4", and the grid i-quants
// "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S".
// Rules (vectors, biases, the router and exp_probs_b are F32 in every mix; rows that are not whole
// blocks of the chosen format fall back as llama.cpp's quantizer does: Q4_K→Q5_0, Q6_K→Q8_0,
// Q2_K/Q3_K/TQ1_0/TQ2_0→Q4_0, the 256-element i-quants→IQ4_NL, and anything whose row is not
// a multiple of 32→F16):
//   Q8_0, BF16, F16, F32: every matrix in that format.
//   Q4_K_M: Q4_K everywhere; output Q6_K; every ffn_down* (dense, shared, routed) and attn_v Q6_K
//   in
//     the "more bits" layers (the first and last eighth, and every third layer between); with
//     exactly 8 experts (llama.cpp's Mixtral rule) attn_k and attn_v Q8_0 and attn_output Q5_K.
//     (MLA's attn_k_b/attn_v_b are not llama.cpp's attn_k/attn_v: the fixtures confirm.)
//   Q2_K: the low-bit class of files people run on one GPU + RAM. Routed experts follow
//     llama.cpp's Q2_K (gate/up Q2_K, down Q3_K); the tensors every token reads (attention,
//     shared experts, dense FFN, token_embd) are Q4_K and output Q6_K, as the widely used
//     low-bit files keep them.
//   IQ4_XS: every matrix IQ4_XS (rows not a multiple of 256 IQ4_NL), output Q6_K, as llama.cpp
//     writes IQ4_XS files.
//   MXFP4_MOE: routed experts MXFP4 and every other matrix Q8_0, as gpt-oss ships (llama.cpp's
//     MXFP4_MOE files).
//   Q4_1, TQ1_0, TQ2_0, MXFP4 and the grid i-quants: every matrix in that format, output Q6_K:
//   files
//     for benches and tests of those formats' kernels (gen-model), not mixes anyone ships.
//   UD-IQ1_S, UD-IQ2_XXS: the "dynamic" low-bit files people run DeepSeek-V3/R1 and Kimi-K2
//     from on one GPU + RAM (131-200 GB for 671B): routed experts gate/up IQ1_S and down
//     IQ2_XXS (UD-IQ1_S), or gate/up IQ2_XXS and down IQ3_XXS (UD-IQ2_XXS); every other matrix
//     Q4_K with ffn_down Q6_K, output Q6_K.
const std::vector<std::string>& quant_mixes();
// Throws tandem::Error for an unknown mix, listing the known ones.
void check_quant_mix(std::string_view mix);

// Whether a mix is one of the single-format files gen-model writes for kernel benches (Q4_1,
// TQ1_0, TQ2_0, MXFP4, the grid i-quants) rather than a mix people ship: the planner does not
// suggest those.
bool is_bench_only_mix(std::string_view mix);

// llama.cpp's "more bits" layers of the Q4_K_M mix: first and last eighth of n_layer (integer
// eighths, as its use_more_bits does), and every third layer after the first eighth.
bool q4_k_m_layer_gets_more_bits(uint32_t layer, uint32_t n_layer);

// Appends tensors in converter order, each matrix in the format the mix gives its name.
class LayoutBuilder {
 public:
  // `n_layer`: the main layers (the more-bits rule counts them); `n_expert`: routed experts.
  LayoutBuilder(std::string_view quant_mix, uint32_t n_layer, uint32_t n_expert);

  void matrix(std::string name, std::vector<uint64_t> shape);
  void vector(std::string name, uint64_t n);  // F32
  std::vector<TensorLayout> take() { return std::move(tensors_); }

 private:
  std::string mix_;
  uint32_t n_layer_, n_expert_;
  std::vector<TensorLayout> tensors_;
};

}  // namespace tandem
