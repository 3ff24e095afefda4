#pragma once
// The GGUF "deepseek2" architecture: DeepSeek-V2, V2-Lite, Coder-V2, V2.5, V3, R1 and models
// that reuse it (Kimi-K2). Multi-head latent attention with a latent KV cache, leading dense
// layers, MoE layers with shared experts and softmax or sigmoid (group-limited) routing.
// Reaches devices only through core/backend.h.
#include <cstdint>
#include <memory>
#include <utility>
#include <span>
#include <vector>

#include "core/backend.h"
#include "gguf/gguf_file.h"
#include "model/deepseek2_hparams.h"
#include "model/device_plan.h"
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
  KernelChoice kernels = KernelChoice::ByTokenCount;  // passed to every matmul-like op
};

// Which products may take 8-bit activations (ActivationBits in core/backend.h). Decided by the
// fixtures (README "Precision"): with the feed-forward products in 8 bits every fixture check
// passes, closer to the exact references than llama.cpp; with every product in 8 bits a V3 check
// fails (its sigmoid group routing flips on small errors), so attention, router and output head
// keep 16.
enum class PrecisionPolicy : uint8_t {
  FfnInt8,  // default: routed experts, shared experts and dense FFNs in 8 bits, the rest in 16
  Int16,    // every product in 16 bits: the closest to the F32 reference (~1e-3 logits)
};

// "ffn-int8", "int16": the --precision names.
inline const char* precision_policy_name(PrecisionPolicy policy) {
  return policy == PrecisionPolicy::FfnInt8 ? "ffn-int8" : "int16";
}

class Deepseek2Model {
 public:
  // Reads the hyperparameters and binds every weight where `devices` says (for devices with
  // their own memory, weights are queued for copying there: finish_loading() copies them, or
  // the first forward() does); the file must outlive the model.
  Deepseek2Model(const gguf::GgufFile& file, const DevicePlan& devices);
  // Everything on one backend.
  Deepseek2Model(const gguf::GgufFile& file, Backend& backend);
  ~Deepseek2Model();

  const Deepseek2Hparams& hparams() const { return hp_; }
  // Layers that run (MTP layers of V3 files excluded).
  uint32_t n_layers() const { return n_layers_; }
  uint64_t weight_bytes() const { return binder_.bound_bytes(); }
  // How often each routed expert was chosen since load: [layer][expert] (empty rows for dense
  // layers). This is what `tandem profile` saves and the planner reads. The counts live on the
  // devices that route (so a captured step counts too) and are copied back here: call it
  // between forward passes, not during one.
  std::vector<std::vector<uint64_t>> routing_counts() const;
  // Decode steps as graphs (core/backend.h): when every layer and the output head run on one
  // device that can capture, with routed experts there or on the host, a step of up to
  // kMaxGraphTokens tokens is captured the second time its shape is seen and replayed after
  // that. On by default; off runs every step op by op (the same results).
  void set_graphs_enabled(bool enabled) { graphs_enabled_ = enabled; }
  // Before the first forward(): captured graphs keep the activations' precision.
  void set_precision(PrecisionPolicy policy) {
    ffn_activations_ = policy == PrecisionPolicy::FfnInt8 ? ActivationBits::Eight : ActivationBits::Sixteen;
  }
  bool captures_steps() const { return graphs_enabled_ && graph_device_ != nullptr; }
  static constexpr int64_t kMaxGraphTokens = 64;
  // Starts reading from disk, in the background, the weights used in place that every token
  // needs (all but the routed experts and the embedding table) and that the page cache does
  // not hold yet, so a cold start streams them with large reads while it computes. Routed
  // experts are started the same way when first chosen.
  void start_reading_weights() const;
  // Copies the weights of devices with their own memory, all devices at once (WeightBinder::
  // finish_uploads), with a progress line when `show_progress`. Called after
  // start_reading_weights(), the disk reads ahead for the CPU while the GPUs are filled.
  void finish_loading(bool show_progress) { binder_.finish_uploads(show_progress); }
  // The parts of the model's files that running so far has needed: every weight read at load
  // or used in place, but of the routed experts only those chosen so far, and none of the
  // embedding table (its rows are a few KiB). What a cold start had to read from disk.
  std::vector<gguf::FileRange> touched_file_ranges() const;
  // Where each part runs (the plan the model was built with).
  const DevicePlan& devices() const { return devices_; }

  // Runs `batch`: stores every token's latent in `cache` (one view per layer, each on its
  // layer's device) and writes the logits of batch.logit_rows to `logits` ([rows, n_vocab],
  // host memory).
  void forward(const Batch& batch, std::span<const KvLayerView> cache, float* logits);

 private:
  struct Layer;
  struct ExpertShard;
  struct HeadShard;
  struct Workspace;
  struct StepInputs;
  struct GraphEntry;
  void bind_attention(Layer& layer, uint32_t il, Backend& on);
  void bind_head_shards(Layer& layer, uint32_t il);
  void bind_experts(Layer& layer, uint32_t il);
  void bind_expert_copies(Layer& layer, uint32_t il,
                          const std::vector<std::vector<Backend*>>& copies);
  void bind_routing_counts();
  // True for tensors whose bytes are needed only in part: routed expert stacks used in place,
  // and the embedding table when the LM head does not share it.
  bool read_on_demand(const WeightBinder::Bound& bound) const;
  Workspace& workspace(Backend& on);
  // The device every step can be captured on (see set_graphs_enabled), or null.
  Backend* find_graph_device() const;
  // Positions and sequence ids of the batch in the memory of each device that runs layers, and
  // the constant routing of dense FFNs; uploaded before a step (outside any capture).
  const StepInputs& step_inputs(Backend& on) const;
  void prepare_step(const Batch& batch);
  // forward() without its checks and its final wait: the embeddings, then the layers op by op,
  // or captured, or replayed.
  void step(const Batch& batch, std::span<const KvLayerView> cache, float* logits);
  // Waits for every device the model used; `report`: rethrows the first error after all waited.
  void synchronize_devices(bool report);
  // Layers and output head for the residual stream `x` on `at`; the logits land in `logits`
  // (host memory), or in the head device's host buffer when `capturing` (read after replay).
  void run_layers(const Batch& batch, std::span<const KvLayerView> cache, Backend* at, float* x,
                  float* logits, bool capturing);
  // Head-split attention of a layer for `h` on the layer's device: q_a and kv_a there, each
  // share's heads on its device, the partial outputs added into `out` in share order.
  void split_attention(uint32_t il, const Batch& batch, const KvLayerView& cache,
                       const float* h, float* out);
  // The copy of `cache` on a share's device (allocated the first time that cache is seen).
  const KvLayerView& cache_copy(HeadShard& shard, const KvLayerView& cache);
  // Moves `bytes` from one device's buffer to another's: a peer copy between GPUs (no host wait),
  // through the host otherwise. The receiver's stream runs a peer copy, or with CopiedBy::Sender
  // the sender's: what a gather uses, so that several devices' copies to one run at once.
  enum class CopiedBy { Receiver, Sender };
  void transfer(Backend& from, const void* src, Backend& to, void* dst, size_t bytes,
                CopiedBy by = CopiedBy::Receiver);
  // The routed experts of a MoE layer for `h` on the layer's device, spread over the devices
  // that hold them; their weighted sum goes to `out`, the shared experts' output (when the
  // model has them) to `shared_out`.
  void routed_experts(const Layer& layer, const float* h, int64_t n_tokens, KernelChoice kernels,
                      float* out, float* shared_out);
  void route(const Layer& layer, const float* h, int64_t n_tokens, KernelChoice kernels,
             int32_t* ids, float* weights, uint64_t* counts);
  // After routing on the host: starts reading the chosen experts not read before, and guesses
  // the next layer's (cold starts).
  void read_ahead_on_host(const Layer& layer, const float* h, const int32_t* ids,
                          int64_t n_tokens, KernelChoice kernels);
  // Starts reading expert `e` of `layer` from disk where it is used in place and not cached
  // (GgufFile::start_reading); true if some of it was not.
  bool start_reading_expert(const Layer& layer, int32_t e, bool urgent) const;

  Deepseek2Hparams hp_;
  DevicePlan devices_;
  WeightBinder binder_;
  WeightView token_embd_, output_;
  const float* output_norm_ = nullptr;
  uint32_t n_layers_ = 0;
  std::vector<Layer> layers_;
  std::vector<std::pair<Backend*, std::unique_ptr<Workspace>>> workspaces_;
  std::vector<uint8_t> staging_;  // host bounce buffer for transfers between devices
  std::vector<uint8_t> guessing_;     // [layer]: guess its experts ahead (MoE layers, cold cache)
  // [layer][expert]: chosen at least once, for the routed experts used in place on the host
  // (read ahead at first use; what a cold start read). Written by the thread that runs them.
  std::vector<std::vector<uint8_t>> expert_seen_;
  // Per device that routes: [n_layers, n_expert] choice counts in its memory.
  std::vector<std::pair<Backend*, std::shared_ptr<DeviceBuffer>>> count_buffers_;
  RopeParams rope_;
  float attention_scale_ = 1.0f;
  // Graphs of decode steps (set_graphs_enabled).
  Backend* graph_device_ = nullptr;
  bool graphs_enabled_ = true;
  ActivationBits ffn_activations_ = ActivationBits::Eight;  // of every MoeOp (set_precision)
  std::vector<GraphEntry> graphs_;
  std::vector<Backend*> step_devices_;  // the devices prepare_step() gives inputs to
  // Bumped whenever a workspace buffer is allocated anew: captured graphs hold its pointers.
  uint64_t buffer_generation_ = 0;
};

}  // namespace tandem
