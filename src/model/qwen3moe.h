#pragma once
// The GGUF "qwen3moe" architecture: Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B and
// Qwen3-Coder-480B-A35B. Grouped-query attention with per-head QK-norm and NeoX rope; every layer
// a MoE layer of softmax-routed experts whose top-k weights are renormalised, no shared expert.
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

struct Qwen3MoeHparams {
  uint32_t n_layer = 0;         // block_count
  uint32_t n_ctx_train = 0;     // context_length
  uint32_t n_embd = 0;          // embedding_length
  uint32_t n_ff = 0;            // feed_forward_length: written by converters, unused by MoE layers
  uint32_t n_head = 0;          // attention.head_count
  uint32_t n_head_kv = 0;       // attention.head_count_kv
  uint32_t head_dim = 0;        // attention.key_length (n_head * head_dim may exceed n_embd)
  uint32_t v_head_dim = 0;      // attention.value_length
  uint32_t n_vocab = 0;         // vocab_size, or the length of tokenizer.ggml.tokens
  uint32_t n_expert = 0;        // expert_count
  uint32_t n_expert_used = 0;   // expert_used_count
  uint32_t n_ff_expert = 0;     // expert_feed_forward_length (default n_ff / n_expert_used)
  float rope_freq_base = 1e6f;  // rope.freq_base
  float rms_norm_eps = 1e-6f;   // attention.layer_norm_rms_epsilon
  bool tied_embeddings = false;  // no output.weight: the head is token_embd (small Qwen3 models)
};

Qwen3MoeHparams read_qwen3moe_hparams(const gguf::GgufFile& file);
void write_qwen3moe_hparams(const Qwen3MoeHparams& hp, gguf::GgufWriter& writer);
ModelInfo qwen3moe_model_info(const Qwen3MoeHparams& hp);
// Every tensor of the main layers as converters write them, in the formats of `quant_mix`.
std::vector<TensorLayout> qwen3moe_layout(const Qwen3MoeHparams& hp, std::string_view quant_mix);
std::unique_ptr<Model> load_qwen3moe(const gguf::GgufFile& file, const DevicePlan& devices);

}  // namespace tandem
