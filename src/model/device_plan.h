#pragma once
// Which backend runs each part of a model: the runtime resolves a placement (plan/) into this,
// and the architecture file follows it. A single-device run names one backend everywhere.
#include <cstdint>
#include <vector>

#include "core/backend.h"

namespace tandem {

struct DevicePlan {
  Backend* embeddings = nullptr;  // token embedding lookup
  Backend* output = nullptr;      // final norm and LM head
  // Per layer: attention, norms, router, shared experts or dense FFN, and the KV cache.
  std::vector<Backend*> layers;
  // Per MoE layer, per routed expert: where its three matrices live (empty for dense layers).
  std::vector<std::vector<Backend*>> experts;

  static DevicePlan single(Backend& backend, uint32_t n_layers, uint32_t n_expert);
};

inline DevicePlan DevicePlan::single(Backend& backend, uint32_t n_layers, uint32_t n_expert) {
  DevicePlan plan;
  plan.embeddings = plan.output = &backend;
  plan.layers.assign(n_layers, &backend);
  plan.experts.assign(n_layers, std::vector<Backend*>(n_expert, &backend));
  return plan;
}

}  // namespace tandem
