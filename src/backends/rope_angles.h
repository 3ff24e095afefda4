#pragma once
// The rotary angles of RoPE with YaRN (RopeOp, core/backend.h), written once for the CPU backend
// and the CUDA kernels. The ramp bounds depend only on the parameters and are computed once per op
// on the host; each (position, rotated pair) then needs one pow, one cos and one sin.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "core/backend.h"
#include "core/host_device.h"

namespace tandem {

// The pair indices between which YaRN ramps from extrapolation to interpolation (both 0 without
// YaRN, where they are not used).
struct YarnRamp {
  float low = 0;
  float high = 0;
};

// The dimension index at which a rotation makes `n_rot` turns over the original context; YaRN
// extrapolates below the beta_fast one and interpolates above the beta_slow one.
inline float yarn_correction_dim(int64_t n_dims, int64_t original_ctx, float n_rot, float base) {
  return float(n_dims) *
         std::log(float(original_ctx) / (n_rot * 2.0f * std::numbers::pi_v<float>)) /
         (2.0f * std::log(base));
}

inline YarnRamp yarn_ramp(const RopeParams& p) {
  if (p.ext_factor == 0.0f) return {};
  return {.low = std::max(0.0f, std::floor(yarn_correction_dim(p.rope_dims, p.original_ctx,
                                                               p.beta_fast, p.freq_base))),
          .high = std::min(float(p.rope_dims - 1),
                           std::ceil(yarn_correction_dim(p.rope_dims, p.original_ctx, p.beta_slow,
                                                         p.freq_base)))};
}

// cos and sin of the angle by which rotated pair i (dims 2i, 2i + 1 of the rotated part) turns at
// position `pos`; low and high from yarn_ramp(p). The blend goes through mul_rn/add_rn so that nvcc
// does not fuse it into an FMA the host does not use.
TANDEM_HD void rope_cos_sin(const RopeParams& p, float low, float high, float pos, int64_t i,
                            float* cos_out, float* sin_out) {
  const float theta_extrap = pos * hd::pow_f(p.freq_base, -2.0f * float(i) / float(p.rope_dims));
  float theta = p.freq_scale * theta_extrap;
  if (p.ext_factor != 0.0f) {
    // The ramp between extrapolation (mix 1, below `low`) and interpolation (mix 0, above `high`).
    const float y = (float(i) - low) / hd::max_f(0.001f, high - low);
    const float mix = (1.0f - hd::min_f(1.0f, hd::max_f(0.0f, y))) * p.ext_factor;
    theta = hd::add_rn(hd::mul_rn(theta, 1.0f - mix), hd::mul_rn(theta_extrap, mix));
  }
  // YaRN's magnitude correction is folded into the attention scale by the caller, so the rotation
  // itself stays unscaled.
  *cos_out = hd::cos_f(theta);
  *sin_out = hd::sin_f(theta);
}

}  // namespace tandem
