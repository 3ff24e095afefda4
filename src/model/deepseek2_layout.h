#pragma once
// The tensor list of a deepseek2 model (model/tensor_layout.h): MLA as current converters store
// it, leading dense layers, MoE layers with shared experts; MTP layers are not listed.
#include <string_view>
#include <vector>

#include "model/deepseek2_hparams.h"
#include "model/tensor_layout.h"

namespace tandem {

// Every tensor of the main layers (0 .. n_layer - n_nextn_layers - 1), in converter order.
// Throws tandem::Error for an unknown mix, listing the known ones. hp.n_vocab must be set.
std::vector<TensorLayout> deepseek2_layout(const Deepseek2Hparams& hp, std::string_view quant_mix);

}  // namespace tandem
