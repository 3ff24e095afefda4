#pragma once
// The GGUF "deepseek2" architecture: DeepSeek-V2, V2-Lite, Coder-V2, V2.5, V3, V3.1, R1 and models
// that reuse it (Kimi-K2). Multi-head latent attention with a latent KV cache (its heads may be
// split over devices), leading dense layers, MoE layers with shared experts and softmax or sigmoid
// (group-limited) routing. Reaches devices only through core/backend.h.
#include <cstdint>
#include <vector>

#include "core/backend.h"
#include "gguf/gguf_file.h"
#include "model/deepseek2_hparams.h"
#include "model/device_plan.h"
#include "model/transformer.h"

namespace tandem {

class Deepseek2Model final : public Transformer {
 public:
  // Reads the hyperparameters and binds every weight where `devices` says (for devices with
  // their own memory, weights are queued for copying there: finish_loading() copies them, or
  // the first forward() does); the file must outlive the model.
  Deepseek2Model(const gguf::GgufFile& file, const DevicePlan& devices);
  // Everything on one backend.
  Deepseek2Model(const gguf::GgufFile& file, Backend& backend);
  ~Deepseek2Model() override;

  const Deepseek2Hparams& hparams() const { return hp_; }

 private:
  struct Layer;
  struct HeadShard;
  Deepseek2Model(const gguf::GgufFile& file, const DevicePlan& devices, const Deepseek2Hparams& hp);
  void layer(uint32_t il, LayerStep& s) override;
  const float* attention_norm(uint32_t il) const override;
  std::vector<Backend*> extra_layer_devices(uint32_t il) const override;
  void bind_attention(Layer& layer, uint32_t il, Backend& on);
  void bind_head_shards(Layer& layer, uint32_t il);
  // MLA of a layer whose heads all run on its device: s.out = attention(s.h).
  void attention(const Layer& layer, LayerStep& s);
  // Head-split attention of a layer for `h` on the layer's device: q_a and kv_a there, each
  // share's heads on its device, the partial outputs added into `out` in share order.
  void split_attention(uint32_t il, const Batch& batch, const KvLayerView& cache,
                       const float* h, float* out);
  // The copy of `cache` on a share's device (allocated the first time that cache is seen).
  const KvLayerView& cache_copy(HeadShard& shard, const KvLayerView& cache);
  // The activation bits of the attention projections (q, q_a/q_b, kv_a, output): the FFNs'
  // under a softmax router (V2, V2-Lite, Coder-V2: their fixtures pass at 8 bits, as qwen3moe's
  // and gpt-oss's do), 16 under V3's sigmoid group selection, which flips experts on the small
  // errors 8 bits make, and in a file without experts, which no fixture measured
  // (docs/correctness.md).
  ActivationBits projection_bits() const {
    return hp_.n_expert > 0 && hp_.gating == ExpertGating::Softmax ? ffn_activations()
                                                                   : ActivationBits::Sixteen;
  }

  Deepseek2Hparams hp_;
  std::vector<Layer> layers_;
  RopeParams rope_;
  float attention_scale_ = 1.0f;
};

}  // namespace tandem
