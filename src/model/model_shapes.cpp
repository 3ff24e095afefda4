// ModelShape (model_shapes.h): one switch over the architectures' hparams structs for each
// question, and the real models' shapes.
#include "model/model_shapes.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/progress.h"
#include "gguf/gguf_file.h"
#include "model/deepseek2_layout.h"
#include "model/deepseek2_shapes.h"

namespace tandem {
namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};

// Qwen3-30B-A3B and Qwen3-Coder-30B-A3B: 48 layers of 32 query heads (4 kv) of 128 over a hidden
// size of 2048, 128 experts of 768 (8 used).
Qwen3MoeHparams qwen3_30b_a3b() {
  Qwen3MoeHparams hp;
  hp.n_layer = 48, hp.n_ctx_train = 40960, hp.n_embd = 2048, hp.n_ff = 6144;
  hp.n_head = 32, hp.n_head_kv = 4, hp.head_dim = 128, hp.v_head_dim = 128, hp.n_vocab = 151936;
  hp.n_expert = 128, hp.n_expert_used = 8, hp.n_ff_expert = 768, hp.rope_freq_base = 1e6f;
  return hp;
}

// Qwen3-235B-A22B: 94 layers, hidden 4096, 64 query heads (4 kv) of 128, 128 experts of 1536.
Qwen3MoeHparams qwen3_235b_a22b() {
  Qwen3MoeHparams hp = qwen3_30b_a3b();
  hp.n_layer = 94, hp.n_embd = 4096, hp.n_ff = 12288, hp.n_head = 64, hp.n_ff_expert = 1536;
  return hp;
}

// Qwen3-Coder-480B-A35B: 62 layers, hidden 6144, 96 query heads (8 kv) of 128, 160 experts of
// 2560, a 256K context.
Qwen3MoeHparams qwen3_coder_480b() {
  Qwen3MoeHparams hp = qwen3_30b_a3b();
  hp.n_layer = 62, hp.n_embd = 6144, hp.n_ff = 8192, hp.n_head = 96, hp.n_head_kv = 8;
  hp.n_expert = 160, hp.n_ff_expert = 2560, hp.n_ctx_train = 262144, hp.rope_freq_base = 1e7f;
  return hp;
}

// gpt-oss-120b: 36 layers, hidden 2880, 64 query heads (8 kv) of 64, 128 experts of 2880 (4
// used), a 128-token window on every other layer, YaRN x32 over 4096.
GptOssHparams gpt_oss_120b() {
  GptOssHparams hp;
  hp.n_layer = 36, hp.n_ctx_train = 131072, hp.n_embd = 2880, hp.n_ff = 2880;
  hp.n_head = 64, hp.n_head_kv = 8, hp.head_dim = 64, hp.v_head_dim = 64, hp.n_vocab = 201088;
  hp.n_expert = 128, hp.n_expert_used = 4, hp.n_ff_expert = 2880, hp.sliding_window = 128;
  hp.rope_freq_base = 150000.0f, hp.rope_scaling_factor = 32.0f, hp.rope_original_ctx = 4096;
  return hp;
}

// gpt-oss-20b: gpt-oss-120b's layers, 24 of them, with 32 experts.
GptOssHparams gpt_oss_20b() {
  GptOssHparams hp = gpt_oss_120b();
  hp.n_layer = 24, hp.n_expert = 32;
  return hp;
}

// GLM-4.5: 92 layers (+1 NextN) of 96 query heads (8 kv) of 128 over a hidden size of 5120,
// QK-norm, 3 dense layers of 12288, then 160 experts of 1536 (8 used, 1 shared).
Glm4MoeHparams glm_4_5() {
  Glm4MoeHparams hp;
  hp.n_layer = 93, hp.n_nextn_layers = 1, hp.n_ctx_train = 131072, hp.n_embd = 5120;
  hp.n_ff_dense = 12288, hp.n_head = 96, hp.n_head_kv = 8, hp.head_dim = 128, hp.v_head_dim = 128;
  hp.n_rot = 64, hp.n_vocab = 151552, hp.n_leading_dense = 3, hp.n_expert = 160;
  hp.n_expert_used = 8, hp.n_expert_shared = 1, hp.n_ff_expert = 1536;
  hp.expert_weights_norm = true, hp.expert_weights_scale = 2.5f, hp.qk_norm = true;
  return hp;
}

// GLM-4.6: GLM-4.5's shapes with a 200K context.
Glm4MoeHparams glm_4_6() {
  Glm4MoeHparams hp = glm_4_5();
  hp.n_ctx_train = 202752;
  return hp;
}

// GLM-4.5-Air: 46 layers (+1 NextN), hidden 4096, 1 dense layer of 10944, 128 experts of 1408,
// no QK-norm.
Glm4MoeHparams glm_4_5_air() {
  Glm4MoeHparams hp = glm_4_5();
  hp.n_layer = 47, hp.n_embd = 4096, hp.n_ff_dense = 10944, hp.n_leading_dense = 1;
  hp.n_expert = 128, hp.n_ff_expert = 1408, hp.qk_norm = false;
  return hp;
}

struct Preset {
  ModelShapeName name;
  ModelShape::Hparams (*hparams)();
};

const std::vector<Preset>& presets() {
  static const std::vector<Preset> list = {
      {{"deepseek-v2", "DeepSeek-V2, V2.5 (236B)"},
       []() -> ModelShape::Hparams { return deepseek2_shape("deepseek-v2"); }},
      {{"deepseek-v2-lite", "DeepSeek-V2-Lite (16B)"},
       []() -> ModelShape::Hparams { return deepseek2_shape("deepseek-v2-lite"); }},
      {{"deepseek-coder-v2", "DeepSeek-Coder-V2 (236B)"},
       []() -> ModelShape::Hparams { return deepseek2_shape("deepseek-v2"); }},
      {{"deepseek-coder-v2-lite", "DeepSeek-Coder-V2-Lite (16B)"},
       []() -> ModelShape::Hparams { return deepseek2_shape("deepseek-v2-lite"); }},
      {{"deepseek-v3", "DeepSeek-V3, V3.1 (671B)"},
       []() -> ModelShape::Hparams { return deepseek2_shape("deepseek-v3"); }},
      {{"deepseek-r1", "DeepSeek-R1 (671B)"},
       []() -> ModelShape::Hparams { return deepseek2_shape("deepseek-v3"); }},
      {{"kimi-k2", "Kimi-K2-Instruct (1T)"},
       []() -> ModelShape::Hparams { return deepseek2_shape("kimi-k2"); }},
      {{"qwen3-30b-a3b", "Qwen3-30B-A3B, Qwen3-Coder-30B-A3B"},
       []() -> ModelShape::Hparams { return qwen3_30b_a3b(); }},
      {{"qwen3-235b-a22b", "Qwen3-235B-A22B"},
       []() -> ModelShape::Hparams { return qwen3_235b_a22b(); }},
      {{"qwen3-coder-480b-a35b", "Qwen3-Coder-480B-A35B"},
       []() -> ModelShape::Hparams { return qwen3_coder_480b(); }},
      {{"gpt-oss-20b", "gpt-oss-20b"}, []() -> ModelShape::Hparams { return gpt_oss_20b(); }},
      {{"gpt-oss-120b", "gpt-oss-120b"}, []() -> ModelShape::Hparams { return gpt_oss_120b(); }},
      {{"glm-4.5", "GLM-4.5 (355B)"}, []() -> ModelShape::Hparams { return glm_4_5(); }},
      {{"glm-4.6", "GLM-4.6 (355B)"}, []() -> ModelShape::Hparams { return glm_4_6(); }},
      {{"glm-4.5-air", "GLM-4.5-Air (106B)"},
       []() -> ModelShape::Hparams { return glm_4_5_air(); }},
  };
  return list;
}

}  // namespace

std::string ModelShape::arch() const {
  return std::visit(Overloaded{[](const Deepseek2Hparams&) { return std::string("deepseek2"); },
                               [](const Qwen3MoeHparams&) { return std::string("qwen3moe"); },
                               [](const GptOssHparams&) { return std::string("gpt-oss"); },
                               [](const Glm4MoeHparams&) { return std::string("glm4moe"); }},
                    hp_);
}

ModelInfo ModelShape::info() const {
  return std::visit(Overloaded{[](const Deepseek2Hparams& hp) { return deepseek2_model_info(hp); },
                               [](const Qwen3MoeHparams& hp) { return qwen3moe_model_info(hp); },
                               [](const GptOssHparams& hp) { return gpt_oss_model_info(hp); },
                               [](const Glm4MoeHparams& hp) { return glm4moe_model_info(hp); }},
                    hp_);
}

std::vector<TensorLayout> ModelShape::layout(std::string_view mix) const {
  return std::visit(
      Overloaded{[&](const Deepseek2Hparams& hp) { return deepseek2_layout(hp, mix); },
                 [&](const Qwen3MoeHparams& hp) { return qwen3moe_layout(hp, mix); },
                 [&](const GptOssHparams& hp) { return gpt_oss_layout(hp, mix); },
                 [&](const Glm4MoeHparams& hp) { return glm4moe_layout(hp, mix); }},
      hp_);
}

void ModelShape::write_hparams(gguf::GgufWriter& writer) const {
  std::visit(Overloaded{[&](const Deepseek2Hparams& hp) { write_deepseek2_hparams(hp, writer); },
                        [&](const Qwen3MoeHparams& hp) { write_qwen3moe_hparams(hp, writer); },
                        [&](const GptOssHparams& hp) { write_gpt_oss_hparams(hp, writer); },
                        [&](const Glm4MoeHparams& hp) { write_glm4moe_hparams(hp, writer); }},
             hp_);
}

ModelShape ModelShape::with_layers(uint32_t n) const {
  const ModelInfo before = info();
  if (n <= before.n_leading_dense)
    fail("{} layers leave no MoE layer; this model has {} dense layer(s) first", n,
         before.n_leading_dense);
  ModelShape out = *this;
  // Files count MTP / NextN blocks in block_count: they stay after the main layers.
  std::visit(Overloaded{[&](Deepseek2Hparams& hp) { hp.n_layer = n + hp.n_nextn_layers; },
                        [&](Glm4MoeHparams& hp) { hp.n_layer = n + hp.n_nextn_layers; },
                        [&](auto& hp) { hp.n_layer = n; }},
             out.hp_);
  return out;
}

ModelShape ModelShape::with_vocab(uint32_t n_vocab) const {
  ModelShape out = *this;
  std::visit([&](auto& hp) { hp.n_vocab = n_vocab; }, out.hp_);
  return out;
}

std::vector<HparamField> ModelShape::fields() const {
  std::vector<HparamField> f;
  auto n = [&](const char* name, double value) { f.push_back({name, value, ""}); };
  auto w = [&](const char* name, std::string word) { f.push_back({name, 0, std::move(word)}); };
  std::visit(
      Overloaded{
          [&](const Deepseek2Hparams& hp) {
            n("n_layer", hp.n_layer), n("n_ctx_train", hp.n_ctx_train), n("n_embd", hp.n_embd);
            n("n_ff_dense", hp.n_ff_dense), n("n_head", hp.n_head), n("n_vocab", hp.n_vocab);
            n("rms_norm_eps", hp.rms_norm_eps), n("q_lora_rank", hp.q_lora_rank);
            n("kv_lora_rank", hp.kv_lora_rank), n("qk_nope_dim", hp.qk_nope_dim);
            n("qk_rope_dim", hp.qk_rope_dim), n("v_head_dim", hp.v_head_dim);
            n("n_leading_dense", hp.n_leading_dense), n("n_expert", hp.n_expert);
            n("n_expert_used", hp.n_expert_used), n("n_expert_shared", hp.n_expert_shared);
            n("n_ff_expert", hp.n_ff_expert), n("n_expert_group", hp.n_expert_group);
            n("n_group_used", hp.n_group_used);
            w("gating", hp.gating == ExpertGating::Sigmoid ? "sigmoid" : "softmax");
            n("expert_weights_norm", hp.expert_weights_norm);
            n("expert_weights_scale", hp.expert_weights_scale),
                n("rope_freq_base", hp.rope_freq_base);
            w("rope_scaling", hp.rope_scaling == RopeScaling::Yarn ? "yarn" : "none");
            n("rope_scaling_factor", hp.rope_scaling_factor),
                n("rope_original_ctx", hp.rope_original_ctx);
            n("yarn_log_multiplier", hp.yarn_log_multiplier),
                n("n_nextn_layers", hp.n_nextn_layers);
          },
          [&](const Qwen3MoeHparams& hp) {
            n("n_layer", hp.n_layer), n("n_ctx_train", hp.n_ctx_train), n("n_embd", hp.n_embd);
            n("n_head", hp.n_head), n("n_head_kv", hp.n_head_kv), n("head_dim", hp.head_dim);
            n("v_head_dim", hp.v_head_dim), n("n_vocab", hp.n_vocab), n("n_expert", hp.n_expert);
            n("n_expert_used", hp.n_expert_used), n("n_ff_expert", hp.n_ff_expert);
            n("rope_freq_base", hp.rope_freq_base), n("rms_norm_eps", hp.rms_norm_eps);
            n("tied_embeddings", hp.tied_embeddings);
          },
          [&](const GptOssHparams& hp) {
            n("n_layer", hp.n_layer), n("n_ctx_train", hp.n_ctx_train), n("n_embd", hp.n_embd);
            n("n_head", hp.n_head), n("n_head_kv", hp.n_head_kv), n("head_dim", hp.head_dim);
            n("v_head_dim", hp.v_head_dim), n("n_vocab", hp.n_vocab), n("n_expert", hp.n_expert);
            n("n_expert_used", hp.n_expert_used), n("n_ff_expert", hp.n_ff_expert);
            n("sliding_window", hp.sliding_window), n("swa_pattern", hp.swa_pattern);
            n("rope_freq_base", hp.rope_freq_base),
                n("rope_scaling_factor", hp.rope_scaling_factor);
            n("rope_original_ctx", hp.rope_original_ctx), n("rms_norm_eps", hp.rms_norm_eps);
          },
          [&](const Glm4MoeHparams& hp) {
            n("n_layer", hp.n_layer), n("n_ctx_train", hp.n_ctx_train), n("n_embd", hp.n_embd);
            n("n_ff_dense", hp.n_ff_dense), n("n_head", hp.n_head), n("n_head_kv", hp.n_head_kv);
            n("head_dim", hp.head_dim), n("v_head_dim", hp.v_head_dim), n("n_rot", hp.n_rot);
            n("n_vocab", hp.n_vocab), n("n_leading_dense", hp.n_leading_dense);
            n("n_expert", hp.n_expert), n("n_expert_used", hp.n_expert_used);
            n("n_expert_shared", hp.n_expert_shared), n("n_ff_expert", hp.n_ff_expert);
            n("n_expert_group", hp.n_expert_group), n("n_group_used", hp.n_group_used);
            w("gating", hp.sigmoid_gating ? "sigmoid" : "softmax");
            n("expert_weights_norm", hp.expert_weights_norm);
            n("expert_weights_scale", hp.expert_weights_scale),
                n("n_nextn_layers", hp.n_nextn_layers);
            n("rope_freq_base", hp.rope_freq_base), n("rms_norm_eps", hp.rms_norm_eps);
            n("qk_norm", hp.qk_norm);
          }},
      hp_);
  return f;
}

std::vector<std::string> ModelShape::describe() const {
  const ModelInfo i = info();
  std::vector<std::string> lines;
  lines.push_back(fmt::format("layers: {} ({} dense, {} MoE)", i.n_layer, i.n_leading_dense,
                              i.n_layer - i.n_leading_dense));
  std::visit(
      Overloaded{
          [&](const Deepseek2Hparams& hp) {
            lines.push_back(fmt::format(
                "attention: MLA, {} heads, q_lora {}, kv_lora {}, qk {} + {} rope, v {}", hp.n_head,
                hp.q_lora_rank ? std::to_string(hp.q_lora_rank) : "none", hp.kv_lora_rank,
                hp.qk_nope_dim, hp.qk_rope_dim, hp.v_head_dim));
            lines.push_back(fmt::format(
                "routing: {}{}{}", hp.gating == ExpertGating::Sigmoid ? "sigmoid" : "softmax",
                hp.n_expert_group > 1
                    ? fmt::format(", {} of {} groups", hp.n_group_used, hp.n_expert_group)
                    : "",
                hp.expert_weights_norm ? ", normalized weights" : ""));
          },
          [&](const Qwen3MoeHparams& hp) {
            lines.push_back(fmt::format(
                "attention: {} query heads, {} kv heads of {}, QK-norm, NeoX rope base {:g}",
                hp.n_head, hp.n_head_kv, hp.head_dim, hp.rope_freq_base));
            lines.push_back("routing: softmax over all experts, top-k renormalised");
          },
          [&](const GptOssHparams& hp) {
            lines.push_back(
                fmt::format("attention: {} query heads, {} kv heads of {}, sinks, window {} on {} "
                            "of every {} layers, "
                            "YaRN x{:g}",
                            hp.n_head, hp.n_head_kv, hp.head_dim, hp.sliding_window,
                            hp.swa_pattern - 1, hp.swa_pattern, hp.rope_scaling_factor));
            lines.push_back(
                "routing: softmax over the top-k router logits; expert biases, clamped SwiGLU");
          },
          [&](const Glm4MoeHparams& hp) {
            lines.push_back(fmt::format(
                "attention: {} query heads, {} kv heads of {}, rope on {} dims{}", hp.n_head,
                hp.n_head_kv, hp.head_dim, hp.n_rot, hp.qk_norm ? ", QK-norm" : ""));
            lines.push_back(fmt::format(
                "routing: {}{}, weights x{:g}{}", hp.sigmoid_gating ? "sigmoid" : "softmax",
                hp.expert_weights_norm ? " normalized" : "", hp.expert_weights_scale,
                hp.n_nextn_layers ? fmt::format("; {} NextN layer(s) skipped", hp.n_nextn_layers)
                                  : ""));
          }},
      hp_);
  lines.push_back(fmt::format("experts: {} routed ({} used), {} shared, width {}", i.n_expert,
                              i.n_expert_used, i.n_expert_shared, i.n_ff_expert));
  int64_t windows = 0;
  for (const KvLayerShape& kv : i.kv) windows += kv.window > 0;
  const KvLayerShape& first = i.kv.front();
  lines.push_back(fmt::format(
      "KV cache: {} values per token per layer ({}){}, {} per token in F32 over every layer ({} "
      "in BF16)",
      first.row_floats(),
      first.latent_dims ? fmt::format("latent {} + rope {}", first.latent_dims, first.rope_dims)
                        : fmt::format("keys {} + values {}", first.k_dims, first.v_dims),
      windows ? fmt::format("; {} sliding-window layers keep only their window", windows) : "",
      format_bytes(i.kv_bytes_per_token(DType::F32)),
      format_bytes(i.kv_bytes_per_token(DType::BF16))));
  return lines;
}

ModelShape model_shape_of(const gguf::GgufFile& file) {
  const std::string arch = file.get_string_or("general.architecture", "(none)");
  if (arch == "deepseek2") return ModelShape(read_deepseek2_hparams(file));
  if (arch == "qwen3moe") return ModelShape(read_qwen3moe_hparams(file));
  if (arch == "gpt-oss") return ModelShape(read_gpt_oss_hparams(file));
  if (arch == "glm4moe") return ModelShape(read_glm4moe_hparams(file));
  fail("{}: architecture '{}' is not supported; tandem runs: {}", file.name(), arch,
       supported_architectures());
}

ModelShape model_shape(std::string_view name) {
  for (const Preset& p : presets())
    if (p.name.name == name) return ModelShape(p.hparams());
  std::string names;
  for (const Preset& p : presets()) names += (names.empty() ? "" : ", ") + p.name.name;
  fail("unknown model shape '{}'; known: {}", name, names);
}

const std::vector<ModelShapeName>& model_shape_names() {
  static const std::vector<ModelShapeName> names = [] {
    std::vector<ModelShapeName> out;
    for (const Preset& p : presets()) out.push_back(p.name);
    return out;
  }();
  return names;
}

}  // namespace tandem
