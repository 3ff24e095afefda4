#include "model/deepseek2_hparams.h"

#include <string>

#include "core/error.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"

namespace tandem {
namespace {

constexpr const char* kArch = "deepseek2";

std::string key(const char* name) { return std::string(kArch) + "." + name; }

// Reads deepseek2.<name> as an unsigned 32-bit count; missing -> fallback (or an error when
// the key is required), negative or huge -> an error naming the key.
uint32_t read_u32(const gguf::GgufFile& file, const char* name, std::optional<uint32_t> fallback) {
  const std::string k = key(name);
  if (!file.find(k)) {
    if (fallback) return *fallback;
    fail("{}: metadata key '{}' is missing; this is required for the deepseek2 architecture",
         file.paths().front(), k);
  }
  const int64_t value = file.get_int(k);
  if (value < 0 || value > int64_t(UINT32_MAX))
    fail("{}: metadata key '{}' = {} is out of range", file.paths().front(), k, value);
  return uint32_t(value);
}

float read_f32(const gguf::GgufFile& file, const char* name, float fallback) {
  const std::string k = key(name);
  return file.find(k) ? float(file.get_number(k)) : fallback;
}

void require(bool ok, const gguf::GgufFile& file, const std::string& what) {
  if (!ok) fail("{}: inconsistent deepseek2 hyperparameters: {}", file.paths().front(), what);
}

}  // namespace

Deepseek2Hparams read_deepseek2_hparams(const gguf::GgufFile& file) {
  const std::string arch = file.get_string("general.architecture");
  if (arch != kArch)
    fail("{}: architecture '{}' is not deepseek2", file.paths().front(), arch);

  Deepseek2Hparams hp;
  hp.n_layer = read_u32(file, "block_count", std::nullopt);
  hp.n_ctx_train = read_u32(file, "context_length", std::nullopt);
  hp.n_embd = read_u32(file, "embedding_length", std::nullopt);
  hp.n_ff_dense = read_u32(file, "feed_forward_length", std::nullopt);
  hp.n_head = read_u32(file, "attention.head_count", std::nullopt);
  hp.rms_norm_eps = read_f32(file, "attention.layer_norm_rms_epsilon", 1e-6f);

  // The vocabulary size is optional in older files: the token list is authoritative then.
  if (file.find(key("vocab_size"))) {
    hp.n_vocab = read_u32(file, "vocab_size", std::nullopt);
  } else if (const gguf::Value* tokens = file.find("tokenizer.ggml.tokens"); tokens && tokens->as_array()) {
    hp.n_vocab = uint32_t(tokens->as_array()->items.size());
  } else {
    fail("{}: metadata key '{}' is missing and there is no tokenizer.ggml.tokens to count",
         file.paths().front(), key("vocab_size"));
  }

  hp.q_lora_rank = read_u32(file, "attention.q_lora_rank", 0u);
  hp.kv_lora_rank = read_u32(file, "attention.kv_lora_rank", std::nullopt);
  hp.qk_rope_dim = read_u32(file, "rope.dimension_count", std::nullopt);
  // Current converters store MLA "absorbed" (key_length = kv_lora + rope) and put the per-head
  // sizes in *_mla keys; older files have only key_length = nope + rope, value_length = v_head.
  if (file.find(key("attention.key_length_mla"))) {
    const uint32_t key_length = read_u32(file, "attention.key_length_mla", std::nullopt);
    require(key_length > hp.qk_rope_dim, file, "attention.key_length_mla must exceed rope.dimension_count");
    hp.qk_nope_dim = key_length - hp.qk_rope_dim;
    hp.v_head_dim = read_u32(file, "attention.value_length_mla", std::nullopt);
  } else {
    const uint32_t key_length = read_u32(file, "attention.key_length", std::nullopt);
    require(key_length > hp.qk_rope_dim, file, "attention.key_length must exceed rope.dimension_count");
    hp.qk_nope_dim = key_length - hp.qk_rope_dim;
    hp.v_head_dim = read_u32(file, "attention.value_length", std::nullopt);
  }

  hp.n_leading_dense = read_u32(file, "leading_dense_block_count", 0u);
  hp.n_expert = read_u32(file, "expert_count", 0u);
  if (hp.n_expert > 0) {
    hp.n_expert_used = read_u32(file, "expert_used_count", std::nullopt);
    hp.n_expert_shared = read_u32(file, "expert_shared_count", 0u);
    hp.n_ff_expert = read_u32(file, "expert_feed_forward_length", std::nullopt);
  }
  hp.n_expert_group = read_u32(file, "expert_group_count", 1u);
  hp.n_group_used = read_u32(file, "expert_group_used_count", 1u);
  const uint32_t gating = read_u32(file, "expert_gating_func", uint32_t(ExpertGating::Softmax));
  if (gating != uint32_t(ExpertGating::Softmax) && gating != uint32_t(ExpertGating::Sigmoid))
    fail("{}: metadata key '{}' = {}: expected 1 (softmax) or 2 (sigmoid)", file.paths().front(),
         key("expert_gating_func"), gating);
  hp.gating = ExpertGating(gating);
  hp.expert_weights_norm = file.find(key("expert_weights_norm")) && file.get_bool(key("expert_weights_norm"));
  hp.expert_weights_scale = read_f32(file, "expert_weights_scale", 1.0f);

  hp.rope_freq_base = read_f32(file, "rope.freq_base", 10000.0f);
  const std::string scaling_key = key("rope.scaling.type");
  const std::string scaling = file.find(scaling_key) ? file.get_string(scaling_key) : "none";
  if (scaling == "yarn") {
    hp.rope_scaling = RopeScaling::Yarn;
    hp.rope_scaling_factor = read_f32(file, "rope.scaling.factor", 1.0f);
    hp.rope_original_ctx = read_u32(file, "rope.scaling.original_context_length", std::nullopt);
    hp.yarn_beta_fast = read_f32(file, "rope.scaling.yarn_beta_fast", 32.0f);
    hp.yarn_beta_slow = read_f32(file, "rope.scaling.yarn_beta_slow", 1.0f);
    hp.yarn_log_multiplier = read_f32(file, "rope.scaling.yarn_log_multiplier", 0.0f);
  } else if (scaling != "none") {
    fail("{}: metadata key '{}' = '{}': supported are 'none' and 'yarn'", file.paths().front(),
         scaling_key, scaling);
  }
  hp.n_nextn_layers = read_u32(file, "nextn_predict_layers", 0u);

  require(hp.n_layer > 0 && hp.n_embd > 0 && hp.n_head > 0, file,
          "block_count, embedding_length and attention.head_count must be positive");
  require(hp.kv_lora_rank > 0, file, "attention.kv_lora_rank must be positive");
  require(hp.qk_rope_dim % 2 == 0, file, "rope.dimension_count must be even");
  require(hp.n_leading_dense <= hp.n_layer, file, "leading_dense_block_count exceeds block_count");
  require(hp.n_nextn_layers < hp.n_layer, file, "nextn_predict_layers must be below block_count");
  if (hp.n_leading_dense < hp.n_layer) {
    require(hp.n_expert > 0, file, "MoE layers need expert_count > 0");
    require(hp.n_expert_used >= 1 && hp.n_expert_used <= hp.n_expert, file,
            "expert_used_count must be between 1 and expert_count");
    require(hp.n_expert_group >= 1 && hp.n_expert % hp.n_expert_group == 0, file,
            "expert_count must be a multiple of expert_group_count");
    require(hp.n_group_used >= 1 && hp.n_group_used <= hp.n_expert_group, file,
            "expert_group_used_count must be between 1 and expert_group_count");
    require(hp.n_expert_used <= hp.n_group_used * (hp.n_expert / hp.n_expert_group), file,
            "expert_used_count exceeds the experts in the used groups");
  }
  return hp;
}

ModelInfo deepseek2_model_info(const Deepseek2Hparams& hp) {
  ModelInfo info;
  info.arch = kArch;
  info.n_layer = hp.n_layer - hp.n_nextn_layers;
  info.n_ctx_train = hp.n_ctx_train;
  info.n_embd = hp.n_embd;
  info.n_vocab = hp.n_vocab;
  info.n_head = hp.n_head;
  info.n_leading_dense = hp.n_leading_dense;
  info.n_ff_dense = hp.n_ff_dense;
  info.n_expert = hp.n_expert;
  info.n_expert_used = hp.n_expert_used;
  info.n_expert_shared = hp.n_expert_shared;
  info.n_ff_expert = hp.n_ff_expert;
  info.kv.assign(info.n_layer,
                 KvLayerShape{.latent_dims = hp.kv_lora_rank, .rope_dims = hp.qk_rope_dim});
  // Per token: the query (through q LoRA or not), the latent and rope key, the absorbed key and
  // value projections of every head, the output projection.
  const double d = hp.n_embd, heads = hp.n_head;
  const double q_b = hp.q_lora_rank ? double(hp.q_lora_rank) * heads * hp.qk_head_dim()
                                    : d * heads * hp.qk_head_dim();
  const double q_a = hp.q_lora_rank ? d * hp.q_lora_rank : 0.0;
  const double kv_a = d * (hp.kv_lora_rank + hp.qk_rope_dim);
  const double kv_b = double(hp.kv_lora_rank) * heads * (hp.qk_nope_dim + hp.v_head_dim);
  const double out = heads * hp.v_head_dim * d;
  info.attention_flops_per_token = 2 * (q_a + q_b + kv_a + kv_b + out);
  // Scores over [latent | rope] and weighted sums of the latent, per head.
  info.attention_flops_per_key = 2.0 * heads * (2.0 * hp.kv_lora_rank + hp.qk_rope_dim);
  // q LoRA, queries, the latent row, queries absorbed into latent space, scores of a tile of 256
  // keys, the output in latent space and per head.
  const uint64_t kv_row = hp.kv_cache_dims();
  info.attention_buffer_floats =
      hp.q_lora_rank + uint64_t(hp.n_head) * hp.qk_head_dim() + kv_row +
      uint64_t(hp.n_head) * (kv_row + 256 + hp.kv_lora_rank + hp.v_head_dim);
  info.attention_output_dims = hp.n_head * hp.v_head_dim;
  const double all = q_a + q_b + kv_a + kv_b + out;
  info.head_split = {.v_head_dim = hp.v_head_dim,
                     .query_input_dims = hp.q_lora_rank ? hp.q_lora_rank : hp.n_embd,
                     .latent_dims = hp.kv_cache_dims(),
                     .head_fraction = all > 0 ? (q_b + kv_b + out) / all : 0.0};
  return info;
}

void write_deepseek2_hparams(const Deepseek2Hparams& hp, gguf::GgufWriter& writer) {
  auto u32 = [&](const char* name, uint32_t value) { writer.add_metadata(key(name), gguf::Value::u32(value)); };
  auto f32 = [&](const char* name, float value) { writer.add_metadata(key(name), gguf::Value::f32(value)); };
  u32("block_count", hp.n_layer);
  u32("context_length", hp.n_ctx_train);
  u32("embedding_length", hp.n_embd);
  u32("feed_forward_length", hp.n_ff_dense);
  u32("attention.head_count", hp.n_head);
  u32("attention.head_count_kv", 1);  // absorbed MLA: one shared latent "head"
  f32("rope.freq_base", hp.rope_freq_base);
  f32("attention.layer_norm_rms_epsilon", hp.rms_norm_eps);
  u32("expert_used_count", hp.n_expert_used);
  u32("expert_group_count", hp.n_expert_group);
  u32("expert_group_used_count", hp.n_group_used);
  u32("expert_gating_func", uint32_t(hp.gating));
  u32("leading_dense_block_count", hp.n_leading_dense);
  u32("vocab_size", hp.n_vocab);
  u32("attention.q_lora_rank", hp.q_lora_rank);
  u32("attention.kv_lora_rank", hp.kv_lora_rank);
  u32("attention.key_length", hp.kv_lora_rank + hp.qk_rope_dim);
  u32("attention.value_length", hp.kv_lora_rank);
  u32("attention.key_length_mla", hp.qk_head_dim());
  u32("attention.value_length_mla", hp.v_head_dim);
  u32("expert_feed_forward_length", hp.n_ff_expert);
  u32("expert_count", hp.n_expert);
  u32("expert_shared_count", hp.n_expert_shared);
  f32("expert_weights_scale", hp.expert_weights_scale);
  writer.add_metadata(key("expert_weights_norm"), gguf::Value::boolean(hp.expert_weights_norm));
  u32("rope.dimension_count", hp.qk_rope_dim);
  if (hp.rope_scaling == RopeScaling::Yarn) {
    writer.add_metadata(key("rope.scaling.type"), gguf::Value::string("yarn"));
    f32("rope.scaling.factor", hp.rope_scaling_factor);
    u32("rope.scaling.original_context_length", hp.rope_original_ctx);
    f32("rope.scaling.yarn_beta_fast", hp.yarn_beta_fast);
    f32("rope.scaling.yarn_beta_slow", hp.yarn_beta_slow);
    f32("rope.scaling.yarn_log_multiplier", hp.yarn_log_multiplier);
  }
}

}  // namespace tandem
