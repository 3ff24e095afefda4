#pragma once
// The GGUF "gpt-oss" architecture (OpenAI gpt-oss-20b and gpt-oss-120b). Grouped-query attention
// with biases, per-head attention sinks and YaRN rope, sliding-window layers alternating with
// full ones; every layer a MoE layer: a router with a bias, the top-k logits weighted by their
// softmax, experts with biases and a clamped SwiGLU (experts shipped in MXFP4).
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

struct GptOssHparams {
  uint32_t n_layer = 0;         // block_count
  uint32_t n_ctx_train = 0;     // context_length
  uint32_t n_embd = 0;          // embedding_length
  uint32_t n_ff = 0;            // feed_forward_length (the experts' width in converted files)
  uint32_t n_head = 0;          // attention.head_count
  uint32_t n_head_kv = 0;       // attention.head_count_kv
  uint32_t head_dim = 0;        // attention.key_length
  uint32_t v_head_dim = 0;      // attention.value_length
  uint32_t n_vocab = 0;         // vocab_size, or the length of tokenizer.ggml.tokens
  uint32_t n_expert = 0;        // expert_count
  uint32_t n_expert_used = 0;   // expert_used_count
  uint32_t n_ff_expert = 0;     // expert_feed_forward_length (required)
  uint32_t sliding_window = 0;  // attention.sliding_window (required): keys per query
  // attention.sliding_window_pattern (default 2): layer il has a sliding window unless
  // il % pattern == pattern - 1 (even layers windowed, odd ones full).
  uint32_t swa_pattern = 2;
  float rope_freq_base = 150000.0f;  // rope.freq_base
  float rope_scaling_factor = 1.0f;  // rope.scaling.factor, YaRN when the type is "yarn"
  uint32_t rope_original_ctx = 0;    // rope.scaling.original_context_length
  float yarn_beta_fast = 32.0f;      // rope.scaling.yarn_beta_fast
  float yarn_beta_slow = 1.0f;       // rope.scaling.yarn_beta_slow
  float rms_norm_eps = 1e-5f;        // attention.layer_norm_rms_epsilon

  bool is_sliding(uint32_t layer) const { return layer % swa_pattern != swa_pattern - 1; }
};

GptOssHparams read_gpt_oss_hparams(const gguf::GgufFile& file);
void write_gpt_oss_hparams(const GptOssHparams& hp, gguf::GgufWriter& writer);
ModelInfo gpt_oss_model_info(const GptOssHparams& hp);
// Every tensor of the main layers as converters write them, in the formats of `quant_mix`.
std::vector<TensorLayout> gpt_oss_layout(const GptOssHparams& hp, std::string_view quant_mix);
std::unique_ptr<Model> load_gpt_oss(const gguf::GgufFile& file, const DevicePlan& devices);

}  // namespace tandem
