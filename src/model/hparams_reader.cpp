#include "model/hparams_reader.h"

#include "core/error.h"
#include "gguf/gguf_file.h"

namespace tandem {

HparamsReader::HparamsReader(const gguf::GgufFile& file, std::string arch)
    : file_(file), arch_(std::move(arch)) {
  const std::string found = file.get_string_or("general.architecture", "(none)");
  if (found != arch_) fail("{}: architecture '{}' is not {}", file.paths().front(), found, arch_);
}

bool HparamsReader::has(const char* name) const {
  return file_.find(key(name)) != nullptr;
}

uint32_t HparamsReader::u32(const char* name) const {
  if (!has(name))
    fail("{}: metadata key '{}' is missing; this is required for the {} architecture",
         file_.paths().front(), key(name), arch_);
  const int64_t value = file_.get_int(key(name));
  if (value < 0 || value > int64_t(UINT32_MAX))
    fail("{}: metadata key '{}' = {} is out of range", file_.paths().front(), key(name), value);
  return uint32_t(value);
}

uint32_t HparamsReader::u32(const char* name, uint32_t fallback) const {
  return has(name) ? u32(name) : fallback;
}

float HparamsReader::f32(const char* name, float fallback) const {
  return has(name) ? float(file_.get_number(key(name))) : fallback;
}

bool HparamsReader::boolean(const char* name, bool fallback) const {
  return has(name) ? file_.get_bool(key(name)) : fallback;
}

std::optional<std::string> HparamsReader::string(const char* name) const {
  if (!has(name)) return std::nullopt;
  return file_.get_string(key(name));
}

uint32_t HparamsReader::vocab_size() const {
  if (has("vocab_size")) return u32("vocab_size");
  if (const gguf::Value* tokens = file_.find("tokenizer.ggml.tokens"); tokens && tokens->as_array())
    return uint32_t(tokens->as_array()->items.size());
  fail("{}: metadata key '{}' is missing and there is no tokenizer.ggml.tokens to count",
       file_.paths().front(), key("vocab_size"));
}

void HparamsReader::require(bool ok, const std::string& what) const {
  if (!ok) fail("{}: inconsistent {} hyperparameters: {}", file_.paths().front(), arch_, what);
}

}  // namespace tandem
