#pragma once
// The shapes of the real models of the deepseek2 family, from each model's config.json, in one
// place: the planner's presets plan them, and gen-model writes synthetic models with them.
#include <string>
#include <string_view>
#include <vector>

#include "model/deepseek2_hparams.h"

namespace tandem {

// "deepseek-v2" (236B; also Coder-V2), "deepseek-v2-lite" (16B; also Coder-V2-Lite),
// "deepseek-v3" (671B; also R1, MTP layer excluded), "kimi-k2" (1T). Throws with the names.
Deepseek2Hparams deepseek2_shape(std::string_view name);
const std::vector<std::string>& deepseek2_shape_names();

}  // namespace tandem
