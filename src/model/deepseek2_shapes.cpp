#include "model/deepseek2_shapes.h"

#include "core/error.h"

namespace tandem {
namespace {

// From each model's config.json (Hugging Face); MTP layers are not counted (converters drop them).

// DeepSeek-V2 and Coder-V2 (236B): 60 layers, 160 experts of 1536 (6 used, 2 shared), softmax
// routing limited to 3 of 8 groups, routed weights scaled by 16.
Deepseek2Hparams v2_hparams() {
  Deepseek2Hparams hp;
  hp.n_layer = 60, hp.n_ctx_train = 163840, hp.n_embd = 5120, hp.n_ff_dense = 12288;
  hp.n_head = 128, hp.n_vocab = 102400, hp.q_lora_rank = 1536;
  hp.kv_lora_rank = 512, hp.qk_nope_dim = 128, hp.qk_rope_dim = 64, hp.v_head_dim = 128;
  hp.n_leading_dense = 1, hp.n_expert = 160, hp.n_expert_used = 6, hp.n_expert_shared = 2;
  hp.n_ff_expert = 1536, hp.n_expert_group = 8, hp.n_group_used = 3;
  hp.gating = ExpertGating::Softmax, hp.expert_weights_scale = 16.0f;
  hp.rope_scaling = RopeScaling::Yarn, hp.rope_scaling_factor = 40, hp.rope_original_ctx = 4096;
  hp.yarn_log_multiplier = 0.0707f;  // 0.1 * mscale_all_dim (0.707)
  return hp;
}

// DeepSeek-V3 and R1 (671B): 61 layers (3 dense of 18432), 256 experts of 2048 (8 used, 1 shared),
// sigmoid routing limited to 4 of 8 groups, normalized weights scaled by 2.5.
Deepseek2Hparams v3_hparams() {
  Deepseek2Hparams hp;
  hp.n_layer = 61, hp.n_ctx_train = 163840, hp.n_embd = 7168, hp.n_ff_dense = 18432;
  hp.n_head = 128, hp.n_vocab = 129280, hp.q_lora_rank = 1536;
  hp.kv_lora_rank = 512, hp.qk_nope_dim = 128, hp.qk_rope_dim = 64, hp.v_head_dim = 128;
  hp.n_leading_dense = 3, hp.n_expert = 256, hp.n_expert_used = 8, hp.n_expert_shared = 1;
  hp.n_ff_expert = 2048, hp.n_expert_group = 8, hp.n_group_used = 4;
  hp.gating = ExpertGating::Sigmoid, hp.expert_weights_norm = true, hp.expert_weights_scale = 2.5f;
  hp.rope_scaling = RopeScaling::Yarn, hp.rope_scaling_factor = 40, hp.rope_original_ctx = 4096;
  hp.yarn_log_multiplier = 0.1f;  // mscale_all_dim 1.0
  return hp;
}

// Kimi-K2 (1T): V3's shapes with 384 experts, 64 heads, one dense layer, no group limit, a
// 163840-token vocabulary, RoPE base 50000 and YaRN factor 32.
Deepseek2Hparams kimi_k2_hparams() {
  Deepseek2Hparams hp = v3_hparams();
  hp.n_ctx_train = 131072, hp.n_head = 64, hp.n_vocab = 163840;
  hp.n_leading_dense = 1, hp.n_expert = 384, hp.n_expert_group = 1, hp.n_group_used = 1;
  hp.expert_weights_scale = 2.827f;
  hp.rope_freq_base = 50000.0f, hp.rope_scaling_factor = 32;
  return hp;
}

// DeepSeek-V2-Lite exactly (its config.json), vocabulary included.
Deepseek2Hparams v2_lite_hparams() {
  Deepseek2Hparams hp;
  hp.n_layer = 27, hp.n_ctx_train = 163840, hp.n_embd = 2048, hp.n_ff_dense = 10944;
  hp.n_head = 16, hp.n_vocab = 102400;
  hp.kv_lora_rank = 512, hp.qk_nope_dim = 128, hp.qk_rope_dim = 64, hp.v_head_dim = 128;
  hp.n_leading_dense = 1, hp.n_expert = 64, hp.n_expert_used = 6, hp.n_expert_shared = 2;
  hp.n_ff_expert = 1408;
  hp.rope_scaling = RopeScaling::Yarn, hp.rope_scaling_factor = 40, hp.rope_original_ctx = 4096;
  hp.yarn_log_multiplier = 0.0707f;  // 0.1 * mscale_all_dim (0.707)
  return hp;
}

}  // namespace

const std::vector<std::string>& deepseek2_shape_names() {
  static const std::vector<std::string> names = {"deepseek-v2", "deepseek-v2-lite", "deepseek-v3", "kimi-k2"};
  return names;
}

Deepseek2Hparams deepseek2_shape(std::string_view name) {
  if (name == "deepseek-v2") return v2_hparams();
  if (name == "deepseek-v2-lite") return v2_lite_hparams();
  if (name == "deepseek-v3") return v3_hparams();
  if (name == "kimi-k2") return kimi_k2_hparams();
  fail("unknown model shape '{}'; known: deepseek-v2, deepseek-v2-lite, deepseek-v3, kimi-k2", name);
}

}  // namespace tandem
