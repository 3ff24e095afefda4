#pragma once
// FNV-1a, 64-bit: the fingerprints ranks compare (the model file, the plan, the cluster) and the
// ids of devices. Not for anything adversarial.
#include <cstdint>
#include <string_view>

namespace tandem {

class Fnv1a {
 public:
  // One value as one unit (a count, an id), not byte by byte.
  void mix(uint64_t value) { hash_ = (hash_ ^ value) * kPrime; }
  void mix_bytes(std::string_view bytes) {
    for (char c : bytes) mix(uint8_t(c));
  }
  uint64_t value() const { return hash_; }

 private:
  static constexpr uint64_t kPrime = 0x100000001b3ull;
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

}  // namespace tandem
