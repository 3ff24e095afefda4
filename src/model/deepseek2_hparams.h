#pragma once
// Hyperparameters of the GGUF "deepseek2" architecture (DeepSeek-V2, V2-Lite, Coder-V2, V2.5,
// V3, R1, Kimi-K2), read once from metadata. Required keys fail with the key's name; optional
// keys have their default written next to the field.
#include <cstdint>

#include "model/model.h"

namespace tandem {
namespace gguf {
class GgufFile;
class GgufWriter;
}

enum class ExpertGating : uint32_t { Softmax = 1, Sigmoid = 2 };  // values as stored in GGUF
enum class RopeScaling { None, Yarn };

struct Deepseek2Hparams {
  uint32_t n_layer = 0;          // block_count (excludes nothing; MTP layers counted separately)
  uint32_t n_ctx_train = 0;      // context_length
  uint32_t n_embd = 0;           // embedding_length (hidden size)
  uint32_t n_ff_dense = 0;       // feed_forward_length: width of the leading dense layers
  uint32_t n_head = 0;           // attention.head_count
  uint32_t n_vocab = 0;          // vocab_size, or the length of tokenizer.ggml.tokens
  float rms_norm_eps = 1e-6f;    // attention.layer_norm_rms_epsilon

  uint32_t q_lora_rank = 0;      // attention.q_lora_rank; 0 = plain attn_q (V2-Lite)
  uint32_t kv_lora_rank = 0;     // attention.kv_lora_rank: the compressed latent per token
  uint32_t qk_nope_dim = 0;      // per-head query/key dims without position
  uint32_t qk_rope_dim = 0;      // rope.dimension_count: per-head dims with RoPE (shared key)
  uint32_t v_head_dim = 0;       // per-head value dims

  uint32_t n_leading_dense = 0;  // leading_dense_block_count
  uint32_t n_expert = 0;         // expert_count (routed)
  uint32_t n_expert_used = 0;    // expert_used_count (top-k)
  uint32_t n_expert_shared = 0;  // expert_shared_count
  uint32_t n_ff_expert = 0;      // expert_feed_forward_length
  uint32_t n_expert_group = 1;   // expert_group_count (group-limited routing, V3)
  uint32_t n_group_used = 1;     // expert_group_used_count
  ExpertGating gating = ExpertGating::Softmax;  // expert_gating_func; V2 files may omit it
  bool expert_weights_norm = false;             // expert_weights_norm
  float expert_weights_scale = 1.0f;            // expert_weights_scale

  float rope_freq_base = 10000.0f;              // rope.freq_base
  RopeScaling rope_scaling = RopeScaling::None; // rope.scaling.type
  float rope_scaling_factor = 1.0f;             // rope.scaling.factor
  uint32_t rope_original_ctx = 0;               // rope.scaling.original_context_length
  float yarn_beta_fast = 32.0f;                 // rope.scaling.yarn_beta_fast
  float yarn_beta_slow = 1.0f;                  // rope.scaling.yarn_beta_slow
  float yarn_log_multiplier = 0.0f;             // rope.scaling.yarn_log_multiplier = 0.1 * mscale_all_dim

  uint32_t n_nextn_layers = 0;  // nextn_predict_layers: V3 MTP layers, skipped by inference

  // Derived sizes.
  uint32_t qk_head_dim() const { return qk_nope_dim + qk_rope_dim; }
  uint32_t kv_cache_dims() const { return kv_lora_rank + qk_rope_dim; }  // latent + shared rope key
  bool is_moe_layer(uint32_t layer) const { return layer >= n_leading_dense && n_expert > 0; }
};

// What the rest of tandem needs to know (model/model.h): sizes, the latent KV cache per layer,
// attention's work, and what head-split attention moves.
ModelInfo deepseek2_model_info(const Deepseek2Hparams& hp);

// Reads and checks the deepseek2 hyperparameters; throws tandem::Error naming the file and key.
Deepseek2Hparams read_deepseek2_hparams(const gguf::GgufFile& file);

// Writes `hp` as deepseek2.* metadata, with the key names and types converters use.
void write_deepseek2_hparams(const Deepseek2Hparams& hp, gguf::GgufWriter& writer);

}  // namespace tandem
