#pragma once
// The GGUF "glm4moe" architecture: GLM-4.5, GLM-4.5-Air and GLM-4.6. Grouped-query attention with
// q/k/v biases, optional QK-norm and NeoX rope over the first half of each head; leading dense
// layers, then MoE layers with sigmoid routing steered by a selection bias, normalised and scaled
// top-k weights and one shared expert. The NextN (multi-token prediction) layers at the end of
// the file are loaded past and not run.
#include <cstdint>
#include <memory>

#include "model/device_plan.h"
#include "model/model.h"
#include "model/tensor_layout.h"

namespace tandem {
namespace gguf {
class GgufFile;
class GgufWriter;
}  // namespace gguf

struct Glm4MoeHparams {
  uint32_t n_layer = 0;               // block_count (counts the NextN layers)
  uint32_t n_ctx_train = 0;           // context_length
  uint32_t n_embd = 0;                // embedding_length
  uint32_t n_ff_dense = 0;            // feed_forward_length: the leading dense layers
  uint32_t n_head = 0;                // attention.head_count
  uint32_t n_head_kv = 0;             // attention.head_count_kv
  uint32_t head_dim = 0;              // attention.key_length
  uint32_t v_head_dim = 0;            // attention.value_length
  uint32_t n_rot = 0;                 // rope.dimension_count (default: head_dim / 2)
  uint32_t n_vocab = 0;               // vocab_size, or the length of tokenizer.ggml.tokens
  uint32_t n_leading_dense = 0;       // leading_dense_block_count (default 0)
  uint32_t n_expert = 0;              // expert_count
  uint32_t n_expert_used = 0;         // expert_used_count
  uint32_t n_expert_shared = 0;       // expert_shared_count
  uint32_t n_ff_expert = 0;           // expert_feed_forward_length
  uint32_t n_expert_group = 1;        // expert_group_count
  uint32_t n_group_used = 1;          // expert_group_used_count
  bool sigmoid_gating = true;         // expert_gating_func: 2 = sigmoid (default), 1 = softmax
  bool expert_weights_norm = false;   // expert_weights_norm (default false)
  float expert_weights_scale = 1.0f;  // expert_weights_scale (default 1)
  uint32_t n_nextn_layers = 0;        // nextn_predict_layers: the last blocks, not run
  float rope_freq_base = 1e6f;        // rope.freq_base
  float rms_norm_eps = 1e-5f;         // attention.layer_norm_rms_epsilon
  bool qk_norm = false;  // attn_q_norm / attn_k_norm present (GLM-4.5 and 4.6, not Air)
};

Glm4MoeHparams read_glm4moe_hparams(const gguf::GgufFile& file);
void write_glm4moe_hparams(const Glm4MoeHparams& hp, gguf::GgufWriter& writer);
ModelInfo glm4moe_model_info(const Glm4MoeHparams& hp);
// Every tensor of the main layers as converters write them, in the formats of `quant_mix`.
std::vector<TensorLayout> glm4moe_layout(const Glm4MoeHparams& hp, std::string_view quant_mix);
std::unique_ptr<Model> load_glm4moe(const gguf::GgufFile& file, const DevicePlan& devices);

}  // namespace tandem
