#pragma once
// The expert FFN's activation of its gate and up products (FfnActivation, core/backend.h), one
// element at a time, written once for the CPU backend and the CUDA kernels: SwiGLU silu(g) * u, or
// gpt-oss's clamped form g' * sigmoid(1.702 g') * (u' + 1) with g' = min(g, 7) and
// u' = clamp(u, -7, 7), as its reference computes it.
#include "core/backend.h"
#include "core/host_device.h"

namespace tandem {

TANDEM_HD float ffn_activation(FfnActivation kind, float gate, float up) {
  if (kind == FfnActivation::SwiGluClamped) {
    constexpr float kAlpha = 1.702f, kLimit = 7.0f;
    const float g = hd::min_f(gate, kLimit), u = hd::min_f(hd::max_f(up, -kLimit), kLimit);
    return g / (1.0f + hd::exp_f(-kAlpha * g)) * (u + 1.0f);
  }
  return gate / (1.0f + hd::exp_f(-gate)) * up;
}

}  // namespace tandem
