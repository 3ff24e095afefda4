#pragma once
// Synthetic models of every architecture tandem runs: seeded random weights of realistic scale in
// the exact tensor layout that converters produce, with a small trained tokenizer of the family's
// kind. They are what tests, benchmarks and the planner run on where no real weights can be
// downloaded.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model_shapes.h"

namespace tandem {

class ThreadPool;

struct SyntheticPreset {
  std::string name;  // "micro", "lite", "qwen3-30b-a3b", ...
  std::string arch;  // the architecture it is a preset of
  std::string description;
  ModelShape shape;        // n_vocab 0 = the trained tokenizer's natural size
  float router_logit_std;  // decisive routing: router rows larger than other matrices
  float output_logit_std;  // LM head: logits with a clear top choice
  float expert_bias_std;   // exp_probs_b (sigmoid routing only)
};

// micro (each architecture), lite and v3-layer (deepseek2), and the real models' shapes of
// model_shapes.h under their names.
const std::vector<SyntheticPreset>& synthetic_presets();
// `arch` empty: the preset of that name of any architecture, deepseek2's micro for "micro". Throws
// with the list.
const SyntheticPreset& find_synthetic_preset(const std::string& name, const std::string& arch = "");

// Weight mixes accepted by --format.
const std::vector<std::string>& synthetic_formats();

struct SyntheticOptions {
  std::string preset = "micro";
  std::string arch;  // picks the architecture of a preset name several have ("micro")
  std::string output_path;
  std::string format = "Q4_K_M";
  uint64_t seed = 42;
  std::optional<uint32_t> n_layers;  // override the preset's layer count
  bool show_progress = true;
};

struct SyntheticSummary {
  uint64_t file_bytes = 0;
  uint64_t n_tensors = 0;
  double seconds = 0;
};

// Streams the model to disk tensor by tensor (bounded memory), using `pool` for generation and
// quantization. Deterministic for a given seed, whatever the thread count.
SyntheticSummary write_synthetic_model(const SyntheticOptions& options, ThreadPool& pool);

}  // namespace tandem
