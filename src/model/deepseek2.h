#pragma once
// The GGUF "deepseek2" architecture: DeepSeek-V2, V2-Lite, Coder-V2, V2.5, V3, R1 and models
// that reuse it (Kimi-K2). Multi-head latent attention with a latent KV cache, leading dense
// layers, MoE layers with shared experts and softmax or sigmoid (group-limited) routing.
// Reaches devices only through core/backend.h.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/backend.h"
#include "model/deepseek2_hparams.h"
#include "model/weight_binder.h"

namespace tandem {
namespace gguf {
class GgufFile;
}

// Tokens of one forward pass, possibly from several sequences (host memory).
struct Batch {
  std::span<const int32_t> tokens;
  std::span<const int32_t> positions;   // position of each token in its sequence
  std::span<const int32_t> seq_ids;     // KV cache slot of each token's sequence
  std::span<const int32_t> logit_rows;  // which tokens' logits to return, in this order
};

class Deepseek2Model {
 public:
  // Reads the hyperparameters and binds every weight; the file must outlive the model.
  Deepseek2Model(const gguf::GgufFile& file, Backend& backend);
  ~Deepseek2Model();

  const Deepseek2Hparams& hparams() const { return hp_; }
  // Layers that run (MTP layers of V3 files excluded).
  uint32_t n_layers() const { return n_layers_; }
  uint64_t weight_bytes() const { return binder_.bound_bytes(); }

  // Runs `batch`: stores every token's latent in `cache` (one view per layer) and writes the
  // logits of batch.logit_rows to `logits` ([rows, n_vocab], host memory).
  void forward(const Batch& batch, std::span<const KvLayerView> cache, float* logits);

 private:
  struct Layer;
  struct Workspace;
  void bind_attention(Layer& layer, uint32_t il);
  void ensure_workspace(int64_t n_tokens, int64_t n_logit_rows);

  Deepseek2Hparams hp_;
  Backend& backend_;
  WeightBinder binder_;
  WeightView token_embd_, output_;
  const float* output_norm_ = nullptr;
  uint32_t n_layers_ = 0;
  std::vector<Layer> layers_;
  std::unique_ptr<Workspace> ws_;
  RopeParams rope_;
  float attention_scale_ = 1.0f;
};

}  // namespace tandem
