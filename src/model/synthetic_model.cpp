#include "model/synthetic_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string_view>
#include <unordered_set>

#include "core/dtype.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "gguf/gguf_writer.h"
#include "model/deepseek2_shapes.h"
#include "model/synthetic_vocabulary.h"
#include "quant/quant.h"

namespace tandem {
namespace {

Deepseek2Hparams deepseek2_micro() {
  Deepseek2Hparams hp;
  hp.n_layer = 3, hp.n_ctx_train = 4096, hp.n_embd = 128, hp.n_ff_dense = 384, hp.n_head = 4;
  hp.kv_lora_rank = 64, hp.qk_nope_dim = 32, hp.qk_rope_dim = 16, hp.v_head_dim = 32;
  hp.n_leading_dense = 1, hp.n_expert = 8, hp.n_expert_used = 2, hp.n_expert_shared = 2;
  hp.n_ff_expert = 64;
  return hp;
}

// The other architectures' micro models, close to the fixtures': a few layers of hidden 128.
Qwen3MoeHparams qwen3moe_micro() {
  Qwen3MoeHparams hp;
  hp.n_layer = 3, hp.n_ctx_train = 4096, hp.n_embd = 128, hp.n_ff = 384, hp.n_head = 8;
  hp.n_head_kv = 2, hp.head_dim = 32, hp.v_head_dim = 32, hp.n_expert = 16, hp.n_expert_used = 4;
  hp.n_ff_expert = 64;
  return hp;
}

GptOssHparams gpt_oss_micro() {
  GptOssHparams hp;
  hp.n_layer = 4, hp.n_ctx_train = 4096, hp.n_embd = 128, hp.n_ff = 64, hp.n_head = 8;
  hp.n_head_kv = 2, hp.head_dim = 32, hp.v_head_dim = 32, hp.n_expert = 8, hp.n_expert_used = 2;
  hp.n_ff_expert = 64, hp.sliding_window = 8, hp.rope_scaling_factor = 32.0f,
  hp.rope_original_ctx = 256;
  return hp;
}

Glm4MoeHparams glm4moe_micro() {
  Glm4MoeHparams hp;
  hp.n_layer = 3, hp.n_ctx_train = 4096, hp.n_embd = 128, hp.n_ff_dense = 384, hp.n_head = 4;
  hp.n_head_kv = 2, hp.head_dim = 64, hp.v_head_dim = 64, hp.n_rot = 32, hp.n_leading_dense = 1;
  hp.n_expert = 16, hp.n_expert_used = 4, hp.n_expert_shared = 1, hp.n_ff_expert = 64;
  hp.expert_weights_norm = true, hp.expert_weights_scale = 2.5f, hp.qk_norm = true;
  return hp;
}

// A few layers of DeepSeek-V3 (671B) shapes: one dense layer, then MoE layers with group-limited
// sigmoid routing over 256 experts. Each MoE layer is ~6 GiB in Q4_K_M.
Deepseek2Hparams deepseek2_v3_layers() {
  Deepseek2Hparams hp = deepseek2_shape("deepseek-v3");
  hp.n_layer = 3, hp.n_leading_dense = 1;
  return hp;
}

// ---- tensors ---------------------------------------------------------------------------------

enum class Init { Gaussian, Ones };

// A tensor of the layout with how its values are drawn.
struct TensorSpec {
  TensorLayout layout;
  Init init;
  float std;  // Gaussian standard deviation
};

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Matrices keep activations at unit scale: std = 1/sqrt(fan_in), where fan_in is the row length
// except for attn_k_b, which multiplies the latent (its shape[1]). The router and the LM head are
// scaled up for decisive routing and clear top tokens; norms start at one.
TensorSpec init_for(TensorLayout layout, const SyntheticPreset& preset) {
  const std::string& name = layout.name;
  const auto& shape = layout.shape;
  auto fan_in = [](uint64_t n) { return 1.0f / std::sqrt(float(n)); };
  if (ends_with(name, "_norm.weight")) return {std::move(layout), Init::Ones, 0.0f};
  // Biases and attention sinks small beside the values they shift (gpt-oss, GLM).
  if (ends_with(name, ".bias") && !ends_with(name, "exp_probs_b.bias"))
    return {std::move(layout), Init::Gaussian, 0.1f};
  if (ends_with(name, "attn_sinks.weight")) return {std::move(layout), Init::Gaussian, 1.0f};
  float std = fan_in(shape[0]);
  if (name == "token_embd.weight")
    std = 1.0f;
  else if (name == "output.weight")
    std = preset.output_logit_std * fan_in(shape[0]);
  else if (ends_with(name, "exp_probs_b.bias"))
    std = preset.expert_bias_std;
  else if (ends_with(name, "ffn_gate_inp.weight"))
    std = preset.router_logit_std * fan_in(shape[0]);
  else if (ends_with(name, "attn_k_b.weight"))
    std = fan_in(shape[1]);
  return {std::move(layout), Init::Gaussian, std};
}

std::vector<TensorSpec> tensor_specs(const SyntheticPreset& preset, const ModelShape& shape,
                                     const std::string& format) {
  std::vector<TensorSpec> specs;
  for (TensorLayout& layout : shape.layout(format))
    specs.push_back(init_for(std::move(layout), preset));
  return specs;
}

// ---- random numbers --------------------------------------------------------------------------

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Each row starts its stream at a hashed point, so rows are independent (consecutive plain
// seeds would make row r+1 the stream of row r shifted by one draw).
uint64_t row_seed(uint64_t tensor_seed, uint64_t row) {
  uint64_t state = tensor_seed ^ (row * 0xd1b54a32d192ed03ull);
  return splitmix64(state);
}

uint64_t hash_name(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (char c : name) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  return h;
}

// Approximately Gaussian values (sum of four uniforms, rescaled to unit variance): smooth
// enough for weights and an order of magnitude cheaper than Box-Muller at 16 billion values.
void fill_gaussian(float* out, uint64_t n, uint64_t seed, float std) {
  uint64_t state = seed;
  const float scale = std * std::sqrt(3.0f) / 32768.0f;  // 4 uniforms of variance 65536²/12
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t r = splitmix64(state);
    const int32_t sum = int32_t(r & 0xffff) + int32_t((r >> 16) & 0xffff) +
                        int32_t((r >> 32) & 0xffff) + int32_t(r >> 48) - 2 * 65535;
    out[i] = float(sum) * 0.5f * scale;
  }
}

int32_t llama_file_type(const std::string& format) {
  if (format == "F32") return 0;
  if (format == "F16") return 1;
  if (format == "Q8_0") return 7;
  if (format == "Q4_K_M") return 15;
  if (format == "IQ4_XS") return 30;
  if (format == "Q4_1") return 3;
  if (format == "TQ1_0") return 36;
  if (format == "TQ2_0") return 37;
  if (format == "MXFP4" || format == "MXFP4_MOE") return 38;
  if (format == "IQ2_XXS") return 19;
  if (format == "IQ2_XS") return 20;
  if (format == "IQ3_XXS") return 23;
  if (format == "IQ1_S") return 24;
  if (format == "IQ3_S") return 26;
  if (format == "IQ2_S") return 28;
  if (format == "IQ1_M") return 31;
  return 32;  // BF16
}

}  // namespace

const std::vector<SyntheticPreset>& synthetic_presets() {
  static const std::vector<SyntheticPreset> presets = [] {
    std::vector<SyntheticPreset> list = {
        {"micro", "deepseek2",
         "3 layers, hidden 128, MLA, 8 experts (2 used, 2 shared): a few MB, for tests",
         ModelShape(deepseek2_micro()), 6.0f, 10.0f, 1.0f},
        {"lite", "deepseek2",
         "DeepSeek-V2-Lite shapes: 27 layers, hidden 2048, 64 experts of 1408 (6 used, 2 shared)",
         ModelShape(deepseek2_shape("deepseek-v2-lite")), 6.0f, 10.0f, 1.0f},
        {"v3-layer", "deepseek2",
         "DeepSeek-V3 shapes, 3 layers (1 dense + 2 MoE): hidden 7168, 256 experts",
         ModelShape(deepseek2_v3_layers()), 8.0f, 10.0f, 1.0f},
        {"micro", "qwen3moe",
         "3 layers, hidden 128, 8 query heads (2 kv) with QK-norm, 16 experts (4 used)",
         ModelShape(qwen3moe_micro()), 6.0f, 10.0f, 1.0f},
        {"micro", "gpt-oss",
         "4 layers, hidden 128, sinks, window 8 on even layers, 8 experts (2 used)",
         ModelShape(gpt_oss_micro()), 6.0f, 10.0f, 1.0f},
        {"micro", "glm4moe",
         "3 layers (1 dense), hidden 128, half-rotary heads, 16 experts (4 used, 1 shared)",
         ModelShape(glm4moe_micro()), 4.0f, 10.0f, 1.0f},
    };
    // The real models' shapes (their vocabularies too: the trained tokens are padded up to them).
    for (const ModelShapeName& n : model_shape_names()) {
      const ModelShape shape = model_shape(n.name);
      list.push_back({n.name, shape.arch(), n.models + " shapes", shape, 6.0f, 10.0f, 1.0f});
    }
    return list;
  }();
  return presets;
}

const SyntheticPreset& find_synthetic_preset(const std::string& name, const std::string& arch) {
  const SyntheticPreset* found = nullptr;
  for (const SyntheticPreset& preset : synthetic_presets())
    if (preset.name == name && (arch.empty() ? !found : preset.arch == arch)) found = &preset;
  if (found) return *found;
  std::string names;
  for (const SyntheticPreset& preset : synthetic_presets())
    if (arch.empty() || preset.arch == arch)
      names += fmt::format("{}{}{}", names.empty() ? "" : ", ", preset.name,
                           arch.empty() && preset.name == "micro" && preset.arch != "deepseek2"
                               ? " (--arch " + preset.arch + ")"
                               : "");
  fail("unknown preset '{}'{}; available presets: {}", name,
       arch.empty() ? "" : fmt::format(" for --arch {}", arch), names);
}

const std::vector<std::string>& synthetic_formats() {
  static const std::vector<std::string> formats = {
      "Q4_K_M", "IQ4_XS", "Q8_0",  "BF16",  "F16",     "F32",    "MXFP4_MOE", "Q4_1",    "TQ1_0",
      "TQ2_0",  "MXFP4",  "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S",     "IQ3_XXS", "IQ3_S"};
  return formats;
}

SyntheticSummary write_synthetic_model(const SyntheticOptions& options, ThreadPool& pool) {
  const auto start = std::chrono::steady_clock::now();
  const SyntheticPreset& preset = find_synthetic_preset(options.preset, options.arch);
  const auto& formats = synthetic_formats();
  if (std::find(formats.begin(), formats.end(), options.format) == formats.end())
    fail("unknown --format '{}'; choose one of {}", options.format, fmt::join(formats, ", "));
  ModelShape shape = preset.shape;
  if (options.n_layers) shape = shape.with_layers(*options.n_layers);

  const SyntheticVocabulary vocabulary = synthetic_vocabulary(preset.arch, shape.info().n_vocab);
  shape = shape.with_vocab(uint32_t(vocabulary.tokens.size()));
  const std::vector<TensorSpec> specs = tensor_specs(preset, shape, options.format);

  gguf::GgufWriter writer(options.output_path);
  writer.add_metadata("general.architecture", gguf::Value::string(preset.arch));
  writer.add_metadata("general.name", gguf::Value::string("tandem-synthetic-" + preset.name));
  writer.add_metadata("general.type", gguf::Value::string("model"));
  writer.add_metadata("general.file_type", gguf::Value::u32(uint32_t(llama_file_type(options.format))));
  writer.add_metadata("general.quantization_version", gguf::Value::u32(2));
  shape.write_hparams(writer);
  write_vocabulary(vocabulary, writer);
  writer.add_metadata("tandem.synthetic",
                      gguf::Value::string(fmt::format(
                          R"({{"preset": "{}", "arch": "{}", "format": "{}", "seed": {}}})",
                          preset.name, preset.arch, options.format, options.seed)));

  uint64_t total_bytes = 0;
  for (const TensorSpec& spec : specs) {
    writer.add_tensor(spec.layout.name, spec.layout.type, spec.layout.shape);
    total_bytes += spec.layout.n_bytes();
  }
  writer.write_header();

  // Bounded memory: at most ~16M floats are generated and quantized at a time.
  constexpr uint64_t kChunkElements = uint64_t(1) << 24;
  std::vector<std::vector<float>> scratch(size_t(pool.size()));
  std::vector<uint8_t> chunk;
  Progress progress("writing " + options.output_path, total_bytes, options.show_progress);
  for (const TensorSpec& spec : specs) {
    const TensorLayout& layout = spec.layout;
    const uint64_t cols = layout.shape[0], rows = layout.n_rows();
    const uint64_t bytes_per_row = row_bytes(layout.type, cols);
    const uint64_t rows_per_chunk = std::max<uint64_t>(1, kChunkElements / cols);
    const uint64_t tensor_seed = options.seed ^ hash_name(layout.name);
    for (auto& row : scratch) row.resize(cols);
    for (uint64_t first = 0; first < rows; first += rows_per_chunk) {
      const uint64_t n = std::min(rows_per_chunk, rows - first);
      chunk.resize(n * bytes_per_row);
      pool.parallel_for(int64_t(n), [&](int64_t i, int thread) {
        float* values = scratch[size_t(thread)].data();
        const uint64_t row = first + uint64_t(i);
        if (spec.init == Init::Ones)
          std::fill(values, values + cols, 1.0f);
        else
          fill_gaussian(values, cols, row_seed(tensor_seed, row), spec.std);
        quantize_row(layout.type, values, chunk.data() + uint64_t(i) * bytes_per_row,
                     int64_t(cols));
      });
      writer.write_tensor_data(layout.name, chunk);
      progress.advance(chunk.size());
    }
  }
  writer.finish();
  progress.finish();
  // Out of the page cache, so the first run reads it back in 2 MiB pages rather than mapping the
  // written 4 KiB ones (as `tandem repack` does its copy: model/repack.cpp).
  drop_written_pages(options.output_path);

  SyntheticSummary summary;
  summary.file_bytes = writer.bytes_written();
  summary.n_tensors = specs.size();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace tandem
