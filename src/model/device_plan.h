#pragma once
// Which backend runs each part of a model: the runtime resolves a placement (plan/) into this,
// and the architecture file follows it. A single-device run names one backend everywhere.
#include <cstdint>
#include <vector>

#include "core/backend.h"

namespace tandem {

class Transport;

// Some heads of one layer's attention on one device (head-split attention).
struct AttentionShare {
  Backend* device = nullptr;
  int32_t first_head = 0;
  int32_t n_heads = 0;
};

// A run spread over ranks (DESIGN.md "Several machines"): the rank that runs each part. Every rank
// walks the same steps; a part runs on its rank, and what crosses ranks goes through the transport.
struct RankPlan {
  Transport* transport = nullptr;  // null: a run of one process, every part here
  int32_t embeddings = 0, output = 0;
  std::vector<int32_t> layers;                // [layer]: attention, norms, router, shared experts
  std::vector<std::vector<int32_t>> experts;  // [layer][routed expert]; dense layers: the layer's

  bool spread() const { return transport != nullptr; }
};

struct DevicePlan {
  Backend* embeddings = nullptr;  // token embedding lookup
  Backend* output = nullptr;      // final norm and LM head
  // Per layer: attention, norms, router, shared experts or dense FFN, and the KV cache.
  std::vector<Backend*> layers;
  // Per MoE layer, per routed expert: where its three matrices live (empty for dense layers).
  std::vector<std::vector<Backend*>> experts;
  // Per MoE layer, per routed expert: the devices that hold a copy of it besides experts[l][e]
  // (empty when no expert has copies). Each step every device of the layer gives each chosen
  // expert to the same one of its holders (core/replica_choice.h), so it is computed once. Copies
  // go only to devices of one kind with memory of their own: the same kernels, the same bits.
  std::vector<std::vector<std::vector<Backend*>>> expert_copies;
  // Per layer: empty when the layer's device computes every head; else the shares in head
  // order, the first on `layers[il]` (which also computes q_a, kv_a and the router and keeps the
  // KV cache). Each share's device computes its heads' queries, attention (from its own copy of
  // the layer's latent cache) and part of the output projection; the layer's device adds the
  // partial outputs in share order. Each share's columns of attn_output must be whole blocks.
  std::vector<std::vector<AttentionShare>> heads;
  // Over several ranks: the parts other ranks run have no device here (null above).
  RankPlan ranks;
  // Prompt chunks of at least this many tokens stream the routed experts held in RAM to the
  // layer's device and compute them there (a GPU's link and speed beating the host's cores on
  // many tokens); smaller steps, and steps that run as graphs, compute them on the host. 0:
  // never. The cost model chooses it (plan::Prediction::stream_experts_min_tokens). The device's
  // kernels compute them then: the host's bits on a simulated device, a GPU's own on a GPU.
  int64_t stream_experts_min_tokens = 0;
  // The most bytes of experts streamed as one group: two such buffers sit on the layer's device,
  // one copied while the other is computed.
  uint64_t stream_group_bytes = uint64_t(64) << 20;

  static DevicePlan single(Backend& backend, uint32_t n_layers, uint32_t n_expert);
};

inline DevicePlan DevicePlan::single(Backend& backend, uint32_t n_layers, uint32_t n_expert) {
  DevicePlan plan;
  plan.embeddings = plan.output = &backend;
  plan.layers.assign(n_layers, &backend);
  plan.experts.assign(n_layers, std::vector<Backend*>(n_expert, &backend));
  plan.heads.assign(n_layers, {});
  return plan;
}

}  // namespace tandem
