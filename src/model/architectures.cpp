// The architectures tandem runs, in one list: each name with how to read its numbers and how to
// build its model. Nothing outside model/ names an architecture; everything asks here.
#include <fmt/format.h>

#include <array>
#include <string_view>

#include "core/error.h"
#include "model/deepseek2.h"
#include "model/deepseek2_hparams.h"
#include "model/glm4moe.h"
#include "model/gpt_oss.h"
#include "model/model.h"
#include "model/qwen3moe.h"

namespace tandem {
namespace {

struct Architecture {
  std::string_view name;  // general.architecture
  ModelInfo (*read_info)(const gguf::GgufFile& file);
  std::unique_ptr<Model> (*load)(const gguf::GgufFile& file, const DevicePlan& devices);
};

ModelInfo deepseek2_info(const gguf::GgufFile& f) {
  return deepseek2_model_info(read_deepseek2_hparams(f));
}
std::unique_ptr<Model> load_deepseek2(const gguf::GgufFile& f, const DevicePlan& d) {
  return std::make_unique<Deepseek2Model>(f, d);
}
ModelInfo qwen3moe_info(const gguf::GgufFile& f) {
  return qwen3moe_model_info(read_qwen3moe_hparams(f));
}
ModelInfo gpt_oss_info(const gguf::GgufFile& f) {
  return gpt_oss_model_info(read_gpt_oss_hparams(f));
}
ModelInfo glm4moe_info(const gguf::GgufFile& f) {
  return glm4moe_model_info(read_glm4moe_hparams(f));
}

constexpr std::array kArchitectures = {
    Architecture{"deepseek2", deepseek2_info, load_deepseek2},
    Architecture{"qwen3moe", qwen3moe_info, load_qwen3moe},
    Architecture{"gpt-oss", gpt_oss_info, load_gpt_oss},
    Architecture{"glm4moe", glm4moe_info, load_glm4moe},
};

const Architecture& architecture_of(const gguf::GgufFile& file) {
  const std::string arch = file.get_string_or("general.architecture", "(none)");
  for (const Architecture& a : kArchitectures)
    if (a.name == arch) return a;
  fail("{}: architecture '{}' is not supported; tandem runs: {}", file.name(), arch,
       supported_architectures());
}

}  // namespace

uint64_t ModelInfo::kv_bytes_per_token(DType cache_type) const {
  uint64_t bytes = 0;
  for (uint32_t il = 0; il < kv.size(); ++il) bytes += kv_bytes_per_token(il, cache_type);
  return bytes;
}

void set_gqa_attention_info(ModelInfo& info, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                            int64_t v_head_dim, std::span<const int64_t> windows) {
  TANDEM_CHECK(windows.size() == info.n_layer);
  info.kv.clear();
  for (const int64_t window : windows)
    info.kv.push_back(
        {.k_dims = n_head_kv * head_dim, .v_dims = n_head_kv * v_head_dim, .window = window});
  const double d = info.n_embd;
  // q, k, v and the output projection.
  info.attention_flops_per_token =
      2 * (d * double(n_head * head_dim) + d * double(n_head_kv * (head_dim + v_head_dim)) +
           double(n_head * v_head_dim) * d);
  // Scores over head_dim and weighted sums over v_head_dim, per query head.
  info.attention_flops_per_key = 2.0 * double(n_head) * double(head_dim + v_head_dim);
  // Queries, keys, values, scores of a tile of 256 keys, outputs.
  info.attention_buffer_floats = uint64_t(n_head * head_dim + n_head_kv * (head_dim + v_head_dim) +
                                          n_head * (256 + v_head_dim));
  info.attention_output_dims = uint32_t(n_head * v_head_dim);
  info.head_split = {};
}

std::string supported_architectures() {
  std::string names;
  for (const Architecture& a : kArchitectures)
    names += fmt::format("{}{}", names.empty() ? "" : ", ", a.name);
  return names;
}

ModelInfo read_model_info(const gguf::GgufFile& file) {
  return architecture_of(file).read_info(file);
}

std::unique_ptr<Model> load_model(const gguf::GgufFile& file, const DevicePlan& devices) {
  return architecture_of(file).load(file, devices);
}

std::unique_ptr<Model> load_model(const gguf::GgufFile& file, Backend& backend) {
  const ModelInfo info = read_model_info(file);
  return load_model(file, DevicePlan::single(backend, info.n_layer, info.n_expert));
}

}  // namespace tandem
