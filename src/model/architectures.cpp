// The architectures tandem runs, in one list: each name with how to read its numbers and how to
// build its model. Nothing outside model/ names an architecture; everything asks here.
#include <fmt/format.h>

#include <array>
#include <string_view>

#include "core/error.h"
#include "model/deepseek2.h"
#include "model/deepseek2_hparams.h"
#include "model/model.h"

namespace tandem {
namespace {

struct Architecture {
  std::string_view name;  // general.architecture
  ModelInfo (*read_info)(const gguf::GgufFile& file);
  std::unique_ptr<Model> (*load)(const gguf::GgufFile& file, const DevicePlan& devices);
};

constexpr std::array kArchitectures = {
    Architecture{
        "deepseek2",
        [](const gguf::GgufFile& f) { return deepseek2_model_info(read_deepseek2_hparams(f)); },
        [](const gguf::GgufFile& f, const DevicePlan& d) -> std::unique_ptr<Model> {
          return std::make_unique<Deepseek2Model>(f, d);
        }},
};

const Architecture& architecture_of(const gguf::GgufFile& file) {
  const std::string arch = file.get_string_or("general.architecture", "(none)");
  for (const Architecture& a : kArchitectures)
    if (a.name == arch) return a;
  fail("{}: architecture '{}' is not supported; tandem runs: {}", file.name(), arch,
       supported_architectures());
}

}  // namespace

uint64_t ModelInfo::kv_bytes_per_token() const {
  uint64_t bytes = 0;
  for (uint32_t il = 0; il < kv.size(); ++il) bytes += kv_bytes_per_token(il);
  return bytes;
}

std::string supported_architectures() {
  std::string names;
  for (const Architecture& a : kArchitectures)
    names += fmt::format("{}{}", names.empty() ? "" : ", ", a.name);
  return names;
}

ModelInfo read_model_info(const gguf::GgufFile& file) {
  return architecture_of(file).read_info(file);
}

std::unique_ptr<Model> load_model(const gguf::GgufFile& file, const DevicePlan& devices) {
  return architecture_of(file).load(file, devices);
}

std::unique_ptr<Model> load_model(const gguf::GgufFile& file, Backend& backend) {
  const ModelInfo info = read_model_info(file);
  return load_model(file, DevicePlan::single(backend, info.n_layer, info.n_expert));
}

}  // namespace tandem
