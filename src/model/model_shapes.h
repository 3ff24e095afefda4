#pragma once
// An architecture's hyperparameters held as one value, so that the planner, gen-model, inspect and
// the tests can carry a model's shape without naming its architecture: its numbers for the rest
// of tandem (ModelInfo), its tensors in a quantization mix, its GGUF metadata. Built from a file
// or from a preset of the real models' shapes (each from its config.json).
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "model/deepseek2_hparams.h"
#include "model/glm4moe.h"
#include "model/gpt_oss.h"
#include "model/model.h"
#include "model/qwen3moe.h"
#include "model/tensor_layout.h"

namespace tandem {
namespace gguf {
class GgufFile;
class GgufWriter;
}  // namespace gguf

// One hyperparameter as `inspect` shows it: a number, or a word (gating "sigmoid").
struct HparamField {
  std::string name;
  double number = 0;
  std::string word;  // non-empty for words
};

class ModelShape {
 public:
  using Hparams = std::variant<Deepseek2Hparams, Qwen3MoeHparams, GptOssHparams, Glm4MoeHparams>;
  explicit ModelShape(Hparams hparams) : hp_(std::move(hparams)) {}

  std::string arch() const;  // general.architecture
  ModelInfo info() const;
  // Every tensor of the main layers in `quant_mix` (tensor_layout.h); n_vocab must be set.
  std::vector<TensorLayout> layout(std::string_view quant_mix) const;
  // The `<arch>.*` keys, as converters write them.
  void write_hparams(gguf::GgufWriter& writer) const;
  // The same model with `n_layer` main layers (benches that cannot hold a whole model); throws
  // when that leaves no MoE layer.
  ModelShape with_layers(uint32_t n_layer) const;
  ModelShape with_vocab(uint32_t n_vocab) const;
  // Every hyperparameter by the name the hparams struct gives it (inspect --json).
  std::vector<HparamField> fields() const;
  // A few lines a person reads: layers, attention, experts, KV cache (inspect).
  std::vector<std::string> describe() const;
  const Hparams& hparams() const { return hp_; }

 private:
  Hparams hp_;
};

// The file's shape; an unknown architecture throws naming the supported ones.
ModelShape model_shape_of(const gguf::GgufFile& file);

// The real models' shapes by name ("deepseek-v3", "qwen3-30b-a3b", "gpt-oss-120b", "glm-4.5-air",
// "kimi-k2", ...); throws listing them.
ModelShape model_shape(std::string_view name);
// Name and the models it stands for ("qwen3-235b-a22b": "Qwen3-235B-A22B, Qwen3-235B-A22B-2507").
struct ModelShapeName {
  std::string name;
  std::string models;
};
const std::vector<ModelShapeName>& model_shape_names();

}  // namespace tandem
