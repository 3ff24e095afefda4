#pragma once
// The model layer as the rest of tandem sees it (DESIGN.md "Layout"): an architecture's numbers
// (ModelInfo), the shape of its KV cache per layer, and the forward pass. The Engine, the KV
// cache, the planner, gen-model, inspect and bench use only this; one file per architecture
// (deepseek2.cpp, qwen3moe.cpp, gpt_oss.cpp, glm4moe.cpp) implements it over the shared blocks
// of transformer.h, and an unknown architecture is refused here, naming the supported ones.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/transport.h"
#include "gguf/gguf_file.h"
#include "model/device_plan.h"

namespace tandem {

// One layer's KV cache row per token: a compressed latent (MLA) or every kv head's key and value,
// and the keys a query sees (a sliding-window layer keeps only those: its cache is a ring).
struct KvLayerShape {
  int64_t latent_dims = 0, rope_dims = 0;  // MLA: kv_lora_rank, then the shared rope key
  int64_t k_dims = 0, v_dims = 0;          // grouped-query attention: n_kv_heads * head_dim each
  int64_t window = 0;                      // keys per query, or 0: every earlier position
  int64_t row_floats() const { return latent_dims + rope_dims + k_dims + v_dims; }
};

// What every architecture tells the rest of tandem: sizes that placement, the KV cache and the
// benches need. Read once from the file (read_model_info) or made from a shape preset.
struct ModelInfo {
  std::string arch;          // general.architecture
  uint32_t n_layer = 0;      // layers that run (MTP / NextN layers excluded)
  uint32_t n_ctx_train = 0;  // context_length
  uint32_t n_embd = 0;       // hidden size
  uint32_t n_vocab = 0;
  uint32_t n_head = 0;           // query heads
  uint32_t n_leading_dense = 0;  // layers before the first MoE layer
  uint32_t n_ff_dense = 0;       // dense FFN width of those
  uint32_t n_expert = 0;         // routed experts per MoE layer
  uint32_t n_expert_used = 0;    // chosen per token
  uint32_t n_expert_shared = 0;  // shared experts (in units of n_ff_expert)
  uint32_t n_ff_expert = 0;      // routed expert FFN width
  std::vector<KvLayerShape> kv;  // [n_layer]
  // Multiply-adds of a layer's attention projections per token, times 2 (FLOPs).
  double attention_flops_per_token = 0;
  // FLOPs per token per key it attends to (scores and weighted sums, all heads).
  double attention_flops_per_key = 0;
  // Floats per token of attention's activations between its ops (queries, keys, scores of a
  // tile of 256 keys, outputs), and the width of its output projection's input.
  uint64_t attention_buffer_floats = 0;
  uint32_t attention_output_dims = 0;
  // Head-split attention (MLA only: DevicePlan::heads): the per-head value width and the sizes
  // the executor sends to each share's device; v_head_dim 0 means the architecture cannot.
  struct HeadSplit {
    uint32_t v_head_dim = 0;
    uint32_t query_input_dims = 0;  // per token: q LoRA rank, or n_embd without one
    uint32_t latent_dims = 0;       // per token: the latent KV row
    double head_fraction = 0;       // of the attention bytes that go with the heads
  } head_split;

  bool is_moe_layer(uint32_t layer) const { return layer >= n_leading_dense && n_expert > 0; }
  // KV cache bytes one token takes over every layer, in rows of `cache_type` values (F32 or
  // BF16); a window layer's ring counts in full as long as the context is shorter than its window.
  uint64_t kv_bytes_per_token(DType cache_type) const;
  uint64_t kv_bytes_per_token(uint32_t layer, DType cache_type) const {
    return row_bytes(cache_type, uint64_t(kv[layer].row_floats()));
  }
};

// Fills what ModelInfo says of grouped-query attention: per layer a K/V cache row (`windows`:
// keys per query of each layer, 0 for full attention), its work per token and per key, its
// buffers. No head split (MLA only).
void set_gqa_attention_info(ModelInfo& info, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                            int64_t v_head_dim, std::span<const int64_t> windows);

// Tokens of one forward pass, possibly from several sequences (host memory).
struct Batch {
  std::span<const int32_t> tokens;
  std::span<const int32_t> positions;   // position of each token in its sequence
  std::span<const int32_t> seq_ids;     // KV cache slot of each token's sequence
  std::span<const int32_t> logit_rows;  // which tokens' logits to return, in this order
  KernelChoice kernels = KernelChoice::ByTokenCount;  // passed to every matmul-like op
};

// Which products may take 8-bit activations (ActivationBits in core/backend.h). Decided by the
// fixtures (docs/correctness.md "Precision"): with the feed-forward products in 8 bits every
// fixture check passes, closer to the exact references than llama.cpp; with every product in 8
// bits a V3 and a GLM-4.5 check fail (their sigmoid expert selection flips on small errors), so
// their attention keeps 16. qwen3moe's, gpt-oss's and DeepSeek-V2's softmax routers pass with
// the attention projections in 8 bits too (GqaConfig::projections_like_ffn,
// Deepseek2Model::projection_bits); router and output head keep 16.
enum class PrecisionPolicy : uint8_t {
  FfnInt8,  // default: routed experts, shared experts and dense FFNs in 8 bits (and the attention
            // projections of softmax-routed models), the rest in 16
  Int16,    // every product in 16 bits: the closest to the F32 reference (~1e-3 logits)
};

// "ffn-int8", "int16": the --precision names.
inline const char* precision_policy_name(PrecisionPolicy policy) {
  return policy == PrecisionPolicy::FfnInt8 ? "ffn-int8" : "int16";
}

class Model {
 public:
  virtual ~Model() = default;

  virtual const ModelInfo& info() const = 0;
  uint32_t n_layers() const { return info().n_layer; }
  virtual uint64_t weight_bytes() const = 0;
  // Where each part runs (the plan the model was built with).
  virtual const DevicePlan& devices() const = 0;
  // How often each routed expert was chosen since load: [layer][expert] (empty rows for dense
  // layers). This is what `tandem profile` saves and the planner reads. Call it between forward
  // passes, not during one.
  virtual std::vector<std::vector<uint64_t>> routing_counts() const = 0;
  // Decode steps as graphs (core/backend.h), where the plan allows: on by default; off runs
  // every step op by op (the same results).
  virtual void set_graphs_enabled(bool enabled) = 0;
  virtual bool captures_steps() const = 0;
  // Before the first forward(): which products take 8-bit activations.
  virtual void set_precision(PrecisionPolicy policy) = 0;
  // Starts reading from disk, in the background, the weights used in place that every token
  // needs and that the page cache does not hold yet (cold starts).
  virtual void start_reading_weights() const = 0;
  // Copies the weights of devices with their own memory, all devices at once.
  virtual void finish_loading(bool show_progress) = 0;
  // The parts of the model's files that running so far has needed (what a cold start read).
  virtual std::vector<gguf::FileRange> touched_file_ranges() const = 0;

  // Runs `batch`: stores every token's keys in `cache` (one view per layer, each on its layer's
  // device, shaped as info().kv says) and writes the logits of batch.logit_rows to `logits`
  // ([rows, n_vocab], host memory).
  //
  // Over several ranks, on rank 0 of a step whose logits come from another rank: with
  // `logits_later`, forward returns once rank 0's part is done and leaves the logits' receive
  // there (into `logits`, which must stay alive until it is waited for), so that rank 0 can start
  // another step meanwhile. Null when nothing was left.
  virtual void forward(const Batch& batch, std::span<const KvLayerView> cache, float* logits,
                       std::unique_ptr<PendingTransfer>* logits_later = nullptr) = 0;
};

// The architectures this build runs, for messages: "deepseek2, qwen3moe, gpt-oss, glm4moe".
std::string supported_architectures();
// Reads the file's architecture numbers; an unknown architecture throws an Error naming it and
// the supported ones.
ModelInfo read_model_info(const gguf::GgufFile& file);
// Binds every weight where `devices` says (see Transformer); the file must outlive the model.
std::unique_ptr<Model> load_model(const gguf::GgufFile& file, const DevicePlan& devices);
// Everything on one backend.
std::unique_ptr<Model> load_model(const gguf::GgufFile& file, Backend& backend);

}  // namespace tandem
