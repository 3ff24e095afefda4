#pragma once
// The shared blocks of every architecture (DESIGN.md "Layout"): the pre-norm layer loop over the
// devices of a plan (the residual stream moves where a layer runs), the embeddings and output head,
// the FFN blocks (a dense SwiGLU, or a MoE layer: routing, routed experts spread over devices with
// copies and host experts, shared experts), and the step machinery around them: per-device
// buffers, the step's inputs in each device's memory, transfers, decode steps captured as graphs,
// routing counts, and cold-start reads of the experts.
//
// An architecture derives from Transformer, binds its attention and norms, calls bind_ffn() for
// every layer, and writes its layer as straight-line code in layer(): norm, attention, residual,
// norm, ffn. Reaches devices only through core/backend.h.
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "gguf/gguf_file.h"
#include "model/device_plan.h"
#include "model/model.h"
#include "model/weight_binder.h"

namespace tandem {

class Transformer : public Model {
 public:
  ~Transformer() override;

  const ModelInfo& info() const override { return info_; }
  uint64_t weight_bytes() const override { return binder_.bound_bytes(); }
  const DevicePlan& devices() const override { return devices_; }
  // The counts live on the devices that route (so a captured step counts too) and are copied
  // back here.
  std::vector<std::vector<uint64_t>> routing_counts() const override;
  // When every layer and the output head run on one device that can capture, with routed experts
  // there or on the host, a step of up to kMaxGraphTokens tokens is captured the second time its
  // shape is seen and replayed after that.
  void set_graphs_enabled(bool enabled) override { graphs_enabled_ = enabled; }
  bool captures_steps() const override { return graphs_enabled_ && graph_device_ != nullptr; }
  void set_precision(PrecisionPolicy policy) override {
    ffn_activations_ =
        policy == PrecisionPolicy::FfnInt8 ? ActivationBits::Eight : ActivationBits::Sixteen;
  }
  // Every token's weights used in place (all but the routed experts and the embedding table)
  // that the page cache does not hold yet, read with large reads in the background; routed
  // experts are started the same way when first chosen.
  void start_reading_weights() const override;
  // Started after start_reading_weights(), the disk reads ahead for the CPU while GPUs fill.
  void finish_loading(bool show_progress) override { binder_.finish_uploads(show_progress); }
  // Every weight read at load or used in place, but of the routed experts only those chosen so
  // far, and none of the embedding table (its rows are a few KiB).
  std::vector<gguf::FileRange> touched_file_ranges() const override;
  void forward(const Batch& batch, std::span<const KvLayerView> cache, float* logits,
               std::unique_ptr<PendingTransfer>* logits_later = nullptr) override;

  static constexpr int64_t kMaxGraphTokens = 64;

 protected:
  // The FFNs' activation bits under the precision policy (set_precision).
  ActivationBits ffn_activations() const { return ffn_activations_; }
  struct Workspace;
  struct StepInputs;
  struct ExpertShard;
  struct FfnLayer;
  struct GraphEntry;

  // How every MoE layer of a model routes and runs its experts.
  struct MoeConfig {
    MoeGating gating = MoeGating::Softmax;
    int64_t n_groups = 1, n_groups_used = 1;  // group-limited selection (DeepSeek); 1/1 = off
    bool normalize = false;                   // divide the chosen weights by their sum
    float scale = 1.0f;                       // then multiply by this
    FfnActivation activation = FfnActivation::SwiGlu;
    bool biases = false;  // router bias and per-expert biases (gpt-oss)
  };

  // Grouped-query attention (gqa_attention.cpp): query heads in groups sharing a kv head, a K/V
  // cache, NeoX rope over the first rope.rope_dims of each head, optional biases, per-head
  // QK-norm, sinks and a sliding window.
  struct GqaConfig {
    int64_t n_head = 0, n_head_kv = 0, head_dim = 0, v_head_dim = 0;
    RopeParams rope;     // rope.rope_dims < head_dim: only the first dims turn (GLM)
    float scale = 1.0f;  // of the scores (1/sqrt(head_dim), YaRN's magnitude folded in)
    // Tensors a file of the architecture must have; the others are bound when present.
    bool needs_qkv_bias = false, needs_output_bias = false, needs_qk_norm = false;
    bool needs_sinks = false;
    // The q/k/v/output projections take the FFNs' activation bits (8 under ffn-int8) rather than
    // 16: for architectures whose quantized fixtures pass so (qwen3moe, gpt-oss: softmax routing;
    // not glm4moe, whose sigmoid selection flips experts on small errors).
    bool projections_like_ffn = false;
  };
  struct GqaWeights {
    WeightView q, k,
        v;  // [n_head * head_dim, n_embd], [n_head_kv * head_dim, n_embd], [.. v_head_dim ..]
    WeightView output;                   // [n_embd, n_head * v_head_dim]
    const float* q_bias = nullptr;       // [n_head * head_dim]
    const float* k_bias = nullptr;       // [n_head_kv * head_dim]
    const float* v_bias = nullptr;       // [n_head_kv * v_head_dim]
    const float* output_bias = nullptr;  // [n_embd]
    const float* q_norm = nullptr;  // [head_dim] RMSNorm of each query head before rope (QK-norm)
    const float* k_norm = nullptr;  // [head_dim]
    const float* sinks = nullptr;   // [n_head] sink logits
    int64_t window = 0;             // keys per query, 0: all
  };

  // One layer's step as layer() sees it: buffers on the layer's device.
  struct LayerStep {
    const Batch& batch;
    const KvLayerView& cache;  // this layer's
    Backend& be;               // the layer's device
    Workspace& ws;             // its buffers
    const StepInputs& in;      // the batch's positions and sequence ids in its memory
    int64_t n_tokens;
    float* x;    // [T, n_embd] residual stream
    float* h;    // [T, n_embd] normed input of the current sub-layer
    float* out;  // [T, n_embd] sub-layer output
    // The layer's first norm and the next layer's, fused into the op that ends the layer before
    // (MoeReduceOp::norm_weight) when both layers run on one device: `normed` when h already
    // holds this layer's normed input; `next_norm` the next layer's weight (null: none).
    bool normed = false;
    const float* next_norm = nullptr;
  };

  // `info` describes the file (n_layer: layers that run); the architecture's constructor binds
  // its weights, then calls finish_binding().
  Transformer(const gguf::GgufFile& file, const DevicePlan& devices, ModelInfo info, float rms_eps);

  // token_embd, output_norm and output (tied to token_embd when the file has no output).
  void bind_embeddings_and_head();
  // Layer il's FFN: ffn_gate/up/down for a dense layer; for a MoE layer the router
  // (ffn_gate_inp, exp_probs_b when present), the routed experts on the devices the plan gives
  // them, and the shared experts when info().n_expert_shared > 0.
  void bind_ffn(uint32_t il, const MoeConfig& moe);
  // After every weight is bound: routing counts on the routing devices, the graph device.
  void finish_binding();

  // The architecture's layer il, one op per line; the cut between devices is already made.
  virtual void layer(uint32_t il, LayerStep& s) = 0;
  // Layer il's first norm (its attention's), which the previous layer's last op applies when
  // the two run on one device (LayerStep::next_norm).
  virtual const float* attention_norm(uint32_t il) const = 0;
  // Devices that run part of layer il besides its own (head-split attention); empty by default.
  virtual std::vector<Backend*> extra_layer_devices(uint32_t il) const;

  // blk.N.attn_q/k/v/output (and their biases, attn_q_norm / attn_k_norm, attn_sinks) on layer
  // il's device; `window` as the architecture sets it for this layer.
  GqaWeights bind_gqa(uint32_t il, const GqaConfig& config, int64_t window);

  // ---- blocks for layer() ----
  // s.out = grouped-query attention of s.h, its keys and values stored in s.cache.
  void gqa_attention(const GqaConfig& config, const GqaWeights& weights, LayerStep& s);
  // s.h = rmsnorm(s.x) * weight, the layer's first norm: nothing to do when the previous
  // layer's last op left it there (s.normed).
  void norm_input(LayerStep& s, const float* weight) const;
  // That norm's op, without running it.
  RmsNormOp residual_norm(const LayerStep& s, const float* weight) const;
  // s.x += s.out, then s.h = rmsnorm(s.x) * weight, as one op (RmsNormOp::residual).
  void add_output_then_norm(LayerStep& s, const float* weight) const;
  // The layer's FFN on s.h, added into s.x: a dense SwiGLU, or the routed experts and then the
  // shared experts (two adds, in that order). With s.next_norm, its last op then leaves the next
  // layer's normed input in s.h.
  void ffn(uint32_t il, LayerStep& s);

  Workspace& workspace(Backend& on);
  // Moves `bytes` from one device's buffer to another's: a peer copy between GPUs (no host wait),
  // through the host otherwise. The receiver's stream runs a peer copy, or with CopiedBy::Sender
  // the sender's: what a gather uses, so that several devices' copies to one run at once.
  enum class CopiedBy { Receiver, Sender };
  void transfer(Backend& from, const void* src, Backend& to, void* dst, size_t bytes,
                CopiedBy by = CopiedBy::Receiver);

  WeightBinder binder_;
  ModelInfo info_;
  DevicePlan devices_;
  float rms_eps_;
  // Bumped whenever a workspace buffer is allocated anew: captured graphs hold its pointers.
  uint64_t buffer_generation_ = 0;

 private:
  // True for tensors whose bytes are needed only in part: routed expert stacks used in place,
  // and the embedding table when the LM head does not share it.
  bool read_on_demand(const WeightBinder::Bound& bound) const;
  void bind_experts(FfnLayer& layer, uint32_t il, const MoeConfig& moe);
  void bind_expert_copies(FfnLayer& layer, uint32_t il,
                          const std::vector<std::vector<Backend*>>& copies);
  // ExpertShard::stream_groups of the layer's host shard, where DevicePlan::
  // stream_experts_min_tokens asks for them and the layer's device can compute them.
  void bind_stream_groups(FfnLayer& layer, uint32_t il);
  // Prompt chunks: the host's experts streamed to the layer's device (stream_groups), computed
  // there group by group into `slots`, two groups' copies in flight.
  void stream_host_experts(const FfnLayer& layer, const ExpertShard& shard, const float* input,
                           const int32_t* ids, float* slots, int64_t n_tokens,
                           KernelChoice kernels);
  // Whether a step of `n_tokens` streams `layer`'s host experts.
  bool streams_host_experts(const FfnLayer& layer, int64_t n_tokens) const;
  void bind_routing_counts();
  // The device every step can be captured on (see set_graphs_enabled), or null.
  Backend* find_graph_device() const;
  const StepInputs& step_inputs(Backend& on) const;
  // Positions and sequence ids of the batch for each device that runs layers, token ids for the
  // embeddings' device, and the constant routing of dense FFNs. Host memory only, but for the
  // constants' uploads when their length grows (never inside a capture): the inputs are written
  // into each device's page-locked buffers (kHostTokens ...) and listed as its uploads.
  void prepare_step(const Batch& batch);
  // The listed uploads, asynchronous on each device's stream: the first ops of a step, so a
  // captured step holds them and a replay needs only prepare_step before it.
  void upload_inputs();
  // forward() without its checks and its final wait: the embeddings, then the layers op by op,
  // or captured, or replayed.
  void step(const Batch& batch, std::span<const KvLayerView> cache, float* logits,
            std::unique_ptr<PendingTransfer>* logits_later);
  // Waits for every device the model used; `report`: rethrows the first error after all waited.
  void synchronize_devices(bool report);
  // Layers and output head for the residual stream `x` on `at`; the logits land in `logits`
  // (host memory), or in the head device's host buffer when `capturing` (read after replay).
  // Over ranks, the head's rank sends them to rank 0 (logits_send_), which receives them here or,
  // given `logits_later`, leaves the receive there (forward()).
  void run_layers(const Batch& batch, std::span<const KvLayerView> cache, Backend* at, float* x,
                  float* logits, bool capturing,
                  std::unique_ptr<PendingTransfer>* logits_later = nullptr);
  // The routed experts of a MoE layer for s.h on the layer's device, spread over the devices
  // that hold them; their weighted sum goes to s.out, the shared experts' output (when the
  // model has them) to `shared_out`, and both are added to s.x by the op that sums the slots
  // (MoeReduceOp's fused residual add), which then leaves the next layer's input in s.h when
  // s.next_norm is set.
  void routed_experts(const FfnLayer& layer, LayerStep& s, float* shared_out);
  void route(const FfnLayer& layer, const float* h, int64_t n_tokens, KernelChoice kernels,
             int32_t* ids, float* weights, uint64_t* counts, bool prepare_experts_input);
  // After routing on the host: starts reading the chosen experts not read before, and guesses
  // the next layer's (cold starts).
  void read_ahead_on_host(const FfnLayer& layer, const float* h, const int32_t* ids,
                          int64_t n_tokens, KernelChoice kernels);
  // Starts reading expert `e` of `layer` from disk where it is used in place and not cached
  // (GgufFile::start_reading); true if some of it was not.
  bool start_reading_expert(const FfnLayer& layer, int32_t e, bool urgent) const;
  // Of the experts chosen in `n` slots, those `shard` (host memory) holds and no step chose before:
  // started reading at once (a cold start), each once. Run by the thread that computes them.
  void read_first_uses(const FfnLayer& layer, const ExpertShard& shard, const int32_t* ids,
                       int64_t n);
  // The moe op of one shard of a layer's routed experts, with `local_index` saying which of them
  // it computes.
  MoeOp shard_op(const FfnLayer& layer, const ExpertShard& shard, const float* input,
                 const int32_t* ids, const int32_t* local_index, float* slots, int64_t n_tokens,
                 KernelChoice kernels) const;

  // ---- a run over several ranks (DevicePlan::ranks) ----
  int32_t my_rank() const;
  // The residual stream crossing the cut before layer `cut` (n_layers: into the output head),
  // `bytes` at `src` on `from_device` of rank `from` to `dst` on `to_device` of rank `to`: a send
  // on one, a receive on the other, nothing on the rest. Devices and pointers of the other rank
  // are unused (null). `crossing` names it in errors ("layer 12's input").
  void move_between_ranks(uint32_t cut, const std::string& crossing, int32_t from,
                          Backend* from_device, const void* src, int32_t to, Backend* to_device,
                          void* dst, size_t bytes);
  // The direct path (core/backend.h's RankChannel) over that cut, found the first time the stream
  // crosses it: the two ranks tell each other their devices' ends (RankChannelEnd) and use the
  // channel between the two devices, opened then if it is not yet, when the ends match; null
  // (through host memory) otherwise, from then on.
  RankChannel* rank_channel(uint32_t cut, const std::string& crossing, int32_t peer, bool sends,
                            Backend& device);
  // The direct path for layer `layer`'s experts' exchange with rank `other` (the layer's rank on
  // a peer, a peer on the layer's rank), negotiated as rank_channel does the first time: between
  // the layer's device and the peer's device of the layer's experts (all on devices with memory of
  // their own; the first of them), null (through host memory) where either end cannot.
  RankChannel* expert_channel(const FfnLayer& layer, int32_t other, Backend& device);
  // Rows `rows` (indices, ascending) of `src` [.., n_embd] into consecutive rows of `dst`, or
  // back (`scatter`): a copy per run of consecutive indices, on `device`.
  void gather_rows(Backend& device, float* dst, const float* src, std::span<const int32_t> rows,
                   bool scatter) const;
  // The tokens (indices into `ids`, [n_tokens][top_k]) routed to at least one expert of layer
  // `il` that `rank` holds, in order (into routed_tokens_).
  const std::vector<int32_t>& tokens_routed_to(size_t il, int32_t rank, const int32_t* ids,
                                               int64_t n_tokens);
  // On the layer's rank, after routing: sends the routing, and the input of the tokens routed to
  // them, to the other ranks that hold some of the layer's experts (`h` and `ids` on the layer's
  // device).
  void send_to_expert_peers(const FfnLayer& layer, const float* h, const int32_t* ids,
                            int64_t n_tokens);
  // On the layer's rank: rank `peer`'s slots for its experts (packed by the peer in slot order)
  // into `place` on the layer's device, zero elsewhere; false, with nothing done, when no token
  // was routed to the peer.
  bool receive_peer_slots(const FfnLayer& layer, int32_t peer, float* place, int64_t n_tokens);
  // On a rank that holds some routed experts of a layer another rank runs: receives the input and
  // routing, computes its experts' slots and sends them back packed.
  void experts_for_layer_rank(const FfnLayer& layer, int64_t n_tokens, KernelChoice kernels);
  // Its two ways, for `n_tokens` of the step's `step_tokens` (their routing in peer_ids_): input
  // and outputs through host memory and MPI, or straight into and out of device `end` over
  // `channel`.
  void experts_through_host(const FfnLayer& layer, int64_t n_tokens, int64_t step_tokens,
                            KernelChoice kernels);
  void experts_on_devices(const FfnLayer& layer, Backend& end, RankChannel& channel,
                          int64_t n_tokens, int64_t step_tokens, KernelChoice kernels);

  WeightView token_embd_, output_;
  const float* output_norm_ = nullptr;
  std::vector<FfnLayer> ffn_;  // [layer]
  std::vector<std::pair<Backend*, std::unique_ptr<Workspace>>> workspaces_;
  std::vector<uint8_t> staging_;   // host bounce buffer for transfers between devices
  std::vector<uint8_t> guessing_;  // [layer]: guess its experts ahead (MoE layers, cold cache)
  // [layer][expert]: chosen at least once, for the routed experts used in place on the host
  // (read ahead at first use; what a cold start read). Written by the thread that runs them.
  std::vector<std::vector<uint8_t>> expert_seen_;
  // Per device that routes: [n_layers, n_expert] choice counts in its memory.
  std::vector<std::pair<Backend*, std::shared_ptr<DeviceBuffer>>> count_buffers_;
  // Graphs of decode steps (set_graphs_enabled).
  Backend* graph_device_ = nullptr;
  // The step runs as a graph on graph_device_ (sized op by op, captured or replayed): its
  // arithmetic must be the same each time, so it never streams experts (streams_host_experts).
  bool graph_step_ = false;
  // A replayed step's logits, read from the graph device's host buffer once forward() has waited
  // for every device (its one synchronization).
  float* replayed_logits_ = nullptr;
  size_t replayed_logit_bytes_ = 0;
  bool graphs_enabled_ = true;
  // Of every MoeOp and dense FFN, and of the attention projections where GqaConfig allows it
  // (set_precision).
  ActivationBits ffn_activations_ = ActivationBits::Eight;
  // The output head's: the FFNs' bits for a Q6_K head (llama.cpp's Q6_K x Q8_K product; every
  // fixture with a Q6_K head stays within llama.cpp's own distance so), 16 for the others (a
  // Q8_0 head at 8 bits moves qwen3moe-small-Q8_0 past it). docs/correctness.md#precision.
  ActivationBits head_activations() const {
    return output_.type == DType::Q6_K ? ffn_activations_ : ActivationBits::Sixteen;
  }
  std::vector<GraphEntry> graphs_;
  std::vector<Backend*> step_devices_;  // the devices prepare_step() gives inputs to
  // Host buffers of a run over several ranks: the bytes crossing ranks, and a MoE layer's input,
  // routing and slots on the ranks that exchange them.
  uint64_t steps_ = 0;  // forward passes so far: named in what crosses ranks
  std::vector<std::byte> rank_staging_;
  // On the head's rank (not rank 0): the last step's logits, copied here from the head's device
  // and on their way to rank 0, sent without waiting for rank 0 to take them (it may be computing
  // the next step, or waiting for the next stage to take that step's input), and finished before
  // the next step's are copied in.
  std::vector<std::byte> logits_sent_;
  std::unique_ptr<PendingTransfer> logits_send_;
  struct OpenChannel {
    int32_t peer;
    Backend* device;          // this rank's end
    uint64_t peer_device_id;  // the other's (RankChannelEnd::device_id)
    std::unique_ptr<RankChannel> channel;
    // Said on stderr for the residual stream's cuts, and for the experts' exchange: once each.
    bool told_residual = false, told_experts = false;
  };
  std::vector<OpenChannel> open_channels_;
  std::map<uint32_t, RankChannel*> rank_channels_;     // [cut] into open_channels_; null: host
  RankChannelEnd my_channel_end_, their_channel_end_;  // members: a timed-out send may read them
  // On the layer's rank peer_input_ and peer_ids_ are every token's, routed_input_ one peer's
  // tokens'; on a peer peer_routing_ is every token's routing, peer_input_ and peer_ids_ its
  // tokens'.
  std::vector<float> peer_input_, routed_input_, peer_slots_, device_slots_, packed_slots_;
  std::vector<int32_t> peer_ids_, peer_routing_, routed_tokens_;
};

}  // namespace tandem
