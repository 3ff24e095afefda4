#pragma once
// Reads an architecture's `<arch>.*` metadata keys once, for the hparams functions of the
// architecture files: a required key that is missing fails with its name, an optional one takes
// the default written at the call, and out-of-range values fail naming the key.
#include <cstdint>
#include <optional>
#include <string>

namespace tandem {
namespace gguf {
class GgufFile;
}

class HparamsReader {
 public:
  // Fails unless general.architecture is `arch`.
  HparamsReader(const gguf::GgufFile& file, std::string arch);

  bool has(const char* name) const;
  uint32_t u32(const char* name) const;  // required
  uint32_t u32(const char* name, uint32_t fallback) const;
  float f32(const char* name, float fallback) const;
  bool boolean(const char* name, bool fallback) const;
  std::optional<std::string> string(const char* name) const;
  // `<arch>.vocab_size`, or the length of tokenizer.ggml.tokens (older files have no key).
  uint32_t vocab_size() const;
  // Fails with "inconsistent <arch> hyperparameters: `what`" unless `ok`.
  void require(bool ok, const std::string& what) const;

  std::string key(const char* name) const { return arch_ + "." + name; }
  const gguf::GgufFile& file() const { return file_; }

 private:
  const gguf::GgufFile& file_;
  std::string arch_;
};

}  // namespace tandem
