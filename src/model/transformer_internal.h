#pragma once
// Internal to model/: the per-layer FFN weights, expert shards and per-device buffers of
// Transformer, shared by the step machinery (transformer.cpp), the FFN blocks (ffn_blocks.cpp) and
// the architecture files, whose attention takes its buffers from the same workspaces.
#include <array>
#include <iterator>
#include <memory>
#include <vector>

#include "model/transformer.h"

namespace tandem {

// One layer's FFN and where it runs; shapes in [rows, cols] of the matrices as the ops see them.
struct Transformer::FfnLayer {
  Backend* device = nullptr;  // the layer's device: runs everything here but the expert shards
  bool moe = false;
  // Dense layers: one SwiGLU FFN, as a one-expert stack.
  WeightView ffn_gate, ffn_up, ffn_down;  // [n_ff, n_embd], [n_ff, n_embd], [n_embd, n_ff]
  // MoE layers.
  MoeConfig config;
  WeightView router;                   // [n_expert, n_embd] router logits
  const float* router_bias = nullptr;  // [n_expert] added to the logits (gpt-oss), or null
  const float* expert_bias = nullptr;  // [n_expert] selection-only bias (exp_probs_b), or null
  std::vector<ExpertShard> shards;     // the routed experts, by device
  // With copies of experts (DevicePlan::expert_copies): the most devices holding one expert (the
  // width of each shard's holders table); 1 without copies.
  int32_t max_holders = 1;
  WeightView gate_shexp, up_shexp, down_shexp;  // shared experts, width n_ff_expert * n_shared
  // The file's tensors of the routed experts (gate, up, down stacks of all experts).
  std::array<const gguf::TensorInfo*, 3> expert_stacks{};
  uint64_t* route_counts = nullptr;  // [n_expert] choices so far, on `device`
  // Over several ranks: the rank that runs the layer (`device` is null on the others), and the
  // other ranks that hold some of its routed experts, in rank order.
  int32_t rank = 0;
  std::vector<int32_t> expert_peers;
};

// The routed experts of one layer that live on one device: stacks of their gate, up and down
// matrices (n_expert_here x the dense shapes with n_ff_expert) and where each expert sits.
struct Transformer::ExpertShard {
  Backend* device = nullptr;
  WeightView gate, up, down;
  const float* gate_bias = nullptr;  // [held, n_ff_expert] per-expert biases (MoeConfig::biases)
  const float* up_bias = nullptr;    // [held, n_ff_expert]
  const float* down_bias = nullptr;  // [held, n_embd]
  std::vector<int32_t> local_index;  // [n_expert]: matrix in the stacks, -1 if elsewhere (host)
  const int32_t* device_local_index = nullptr;  // the same in the device's memory
  std::shared_ptr<DeviceBuffer> local_index_buffer;
  // With copies: the layer's holders table in the device's memory, the step's local index (which
  // of its experts this device computes this step: ReplicaPickOp) that its moe op reads, and the
  // local index of its home experts only (prompt chunks, which do not use the copies).
  std::shared_ptr<DeviceBuffer> holders_buffer, step_index_buffer, home_index_buffer;
  // The host's experts as prompt chunks stream them to the layer's device
  // (DevicePlan::stream_experts_min_tokens): runs of consecutive matrices of the stacks, each
  // copied whole into one of two buffers there and computed with its own local index (its
  // experts numbered from 0, every other -1). Empty where the layer's device cannot multiply
  // these formats or computes on host memory itself.
  struct StreamGroup {
    int32_t first = 0, count = 0;    // matrices of the stacks
    const int32_t* index = nullptr;  // [n_expert] on the layer's device, in stream_index
  };
  std::vector<StreamGroup> stream_groups;
  std::shared_ptr<DeviceBuffer> stream_index;  // [groups, n_expert]: one allocation a layer
  size_t stream_buffer_bytes = 0;  // the largest group's weights and biases, as laid out there
};

// The step's per-token arrays as one device's ops read them (its memory).
struct Transformer::StepInputs {
  const int32_t* tokens = nullptr;       // [T], on the embeddings device only
  const int32_t* positions = nullptr;    // [T]
  const int32_t* seq_ids = nullptr;      // [T]
  const int32_t* dense_ids = nullptr;    // [T] zeros: a dense FFN is expert 0 of 1
  const float* dense_weights = nullptr;  // [T] ones
};

// A decode step's graph for one shape; `seen` before it is captured: the first step of a shape
// runs op by op and sizes every buffer, so that nothing allocates inside the capture.
struct Transformer::GraphEntry {
  int64_t n_tokens;
  KernelChoice kernels;
  bool sized = false;            // a step of this shape ran op by op and sized every buffer
  bool capture_failed = false;   // then this shape runs op by op
  uint64_t generation = 0;       // buffer_generation_ when captured
  const void* cache = nullptr;   // the KV cache it was captured with (first layer's rows)
  std::unique_ptr<Graph> graph;
};

// Activation buffers of one device, allocated on first use and grown for larger batches: a
// device that only holds experts gets only the buffers the experts need.
struct Transformer::Workspace {
  enum Buffer {
    kResidual,       // [T, n_embd] residual stream
    kNormed,         // [T, n_embd] normed input of a sub-layer
    kQueryLora,      // [T, q_lora] (MLA)
    kQuery,          // [T, n_head, head dims]
    kLatent,         // [T, kv_lora + rope] (MLA)
    kKeys,           // [T, n_kv_head, head_dim] (grouped-query attention)
    kValues,         // [T, n_kv_head, v_head_dim]
    kAttention,      // [T, n_head * v_head]
    kOutput,         // [T, n_embd] sub-layer output
    kPartial,        // [T, n_embd] this device's part of another's head-split attention output
    kOtherPartials,  // [shares - 1, T, n_embd] the other shares' parts, on the layer's device
    kShared,         // [T, n_embd] shared experts output
    kSharedSlot,     // [T, 1, n_embd] shared experts before weighting
    kRouter,         // [T, n_expert]
    kSlots,          // [T, top_k, n_embd] expert outputs before weighting
    kOtherSlots,     // [devices - 1, T, top_k, n_embd] slots other devices computed, to be added
    kExpertIds,      // [T, top_k] int32 routing of the current MoE layer
    kExpertWeights,  // [T, top_k]
    kGuessIds,       // [T, top_k] int32 the next layer's routing guessed from this one's input
    kGuessWeights,   // [T, top_k]
    kTokens,         // [T] int32
    kPositions,      // [T] int32
    kSeqIds,         // [T] int32
    kDenseIds,       // [T] int32 zeros
    kDenseWeights,   // [T] ones
    kLast,           // [rows, n_embd] hidden states that need logits
    kLogits,         // [rows, n_vocab]
    kRankPacked,     // [rows, n_embd] rows packed for another rank's device (experts' exchange)
    kStreamed0,      // one group of the host's experts streamed here (ExpertShard::StreamGroup)
    kStreamed1,      // the next group, copied while the first is computed
    kCount
  };
  // Host memory of this device's kind (page-locked for a GPU) for its asynchronous copies.
  enum HostBuffer {
    kHostInput,      // [T, n_embd] a MoE layer's input, for the host's experts
    kHostIds,        // [T, top_k] int32 its routing
    kHostSlots,      // [T, top_k, n_embd] the host's expert outputs
    kHostLogits,     // [rows, n_vocab] logits of a replayed graph
    kHostTokens,     // [T] int32 the step's inputs, staged for their copy to this device
    kHostPositions,  // [T] int32
    kHostSeqIds,     // [T] int32
    kHostEmbedded,   // [T, n_embd] the host's embedding lookup, for a step captured here
    kHostCount
  };
  Backend* device = nullptr;
  uint64_t* generation = nullptr;  // the model's buffer_generation_
  std::shared_ptr<DeviceBuffer> buffers[kCount];
  std::shared_ptr<DeviceBuffer> host_buffers[kHostCount];
  StepInputs inputs;
  // The copies of the staged inputs (kHostTokens ...) this device's step starts with
  // (Transformer::upload_inputs): destination, source, bytes.
  struct Upload {
    void* to;
    const void* from;
    size_t bytes;
  };
  std::vector<Upload> uploads;
  // Of the two buffers the host's experts stream through (kStreamed0/1), the event after the op
  // that read each last, whatever layer it was: a copy into one waits for it.
  std::shared_ptr<Event> stream_released[2];
  int64_t dense_filled = 0;  // entries of kDenseIds / kDenseWeights holding their constants

  float* get(Buffer which, int64_t n_floats) {
    return static_cast<float*>(grow(which, size_t(n_floats) * 4));
  }
  int32_t* ints(Buffer which, int64_t n) {
    return static_cast<int32_t*>(grow(which, size_t(n) * 4));
  }
  uint8_t* bytes(Buffer which, size_t n) { return static_cast<uint8_t*>(grow(which, n)); }
  void* host(HostBuffer which, size_t bytes) {
    static constexpr const char* kNames[] = {"host experts' input",   "host experts' routing",
                                             "host experts' outputs", "logits (host)",
                                             "token ids (host)",      "positions (host)",
                                             "sequence ids (host)",   "embedded tokens (host)"};
    static_assert(std::size(kNames) == kHostCount, "a name for every host buffer");
    std::shared_ptr<DeviceBuffer>& buffer = host_buffers[which];
    if (!buffer || buffer->size() < std::max<size_t>(bytes, 1)) {
      ++*generation;  // before the old one goes: graphs captured with it are stale even if this
                      // fails
      if (buffer) device->synchronize();  // queued copies may still use the old one
      buffer.reset();
      buffer = device->allocate_host(std::max<size_t>(bytes, 1), kNames[which]);
    }
    return buffer->data();
  }

 private:
  void* grow(Buffer which, size_t bytes) {
    static constexpr const char* kNames[] = {"residual stream",
                                             "normed activations",
                                             "q LoRA activations",
                                             "queries",
                                             "latent keys",
                                             "keys",
                                             "values",
                                             "attention output",
                                             "sub-layer output",
                                             "partial attention output",
                                             "other devices' partial attention outputs",
                                             "shared experts output",
                                             "shared experts slot",
                                             "router logits",
                                             "expert outputs",
                                             "expert outputs of other devices",
                                             "expert ids",
                                             "expert weights",
                                             "guessed expert ids",
                                             "guessed expert weights",
                                             "token ids",
                                             "positions",
                                             "sequence ids",
                                             "dense routing ids",
                                             "dense routing weights",
                                             "final hidden states",
                                             "logits",
                                             "rows packed for another rank",
                                             "streamed experts",
                                             "streamed experts (second buffer)"};
    static_assert(std::size(kNames) == kCount, "a name for every buffer");
    bytes = std::max<size_t>(bytes, 4);
    std::shared_ptr<DeviceBuffer>& buffer = buffers[which];
    if (!buffer || buffer->size() < bytes) {
      ++*generation;  // graphs captured with the old pointer are stale now, even if this fails
      // Work queued on the device may still read or write the old one (a buffer can grow in the
      // middle of a step: the rows packed for another rank, peer by peer).
      if (buffer) device->synchronize();
      buffer.reset();  // give the old one back first: budgets are tight on small devices
      buffer = device->allocate(bytes, kNames[which]);
    }
    return buffer->data();
  }
};

}  // namespace tandem
