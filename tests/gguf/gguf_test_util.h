#pragma once
// Helpers for the GGUF tests: a byte builder for hand-made (often corrupt) images, a scratch
// folder per test, and "parse this and give me the error message".
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "gguf/gguf_file.h"

namespace tandem::gguf::test {

// Builds GGUF bytes field by field, so a test can write exactly the corruption it wants.
struct Bytes {
  std::vector<uint8_t> b;

  Bytes& raw(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    b.insert(b.end(), p, p + n);
    return *this;
  }
  Bytes& u8(uint8_t v) { return raw(&v, 1); }
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& str(std::string_view s) { return u64(s.size()).raw(s.data(), s.size()); }
  Bytes& header(uint64_t n_tensors, uint64_t n_metadata, uint32_t version = 3) {
    return raw("GGUF", 4).u32(version).u64(n_tensors).u64(n_metadata);
  }
  Bytes& key(std::string_view k, ValueType type) { return str(k).u32(uint32_t(type)); }
  Bytes& kv_u32(std::string_view k, uint32_t v) { return key(k, ValueType::U32).u32(v); }
  Bytes& kv_str(std::string_view k, std::string_view v) { return key(k, ValueType::String).str(v); }
  Bytes& tensor(std::string_view name, std::initializer_list<uint64_t> shape, uint32_t type,
                uint64_t offset) {
    str(name).u32(uint32_t(shape.size()));
    for (uint64_t d : shape) u64(d);
    return u32(type).u64(offset);
  }
  Bytes& pad(uint64_t alignment = 32) {
    while (b.size() % alignment) b.push_back(0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

// The tandem::Error message of parsing `bytes`, or "" when it parses. Any other exception
// fails the test: hostile input must only ever produce tandem::Error.
inline std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    GgufFile::parse_memory(bytes, "bad.gguf");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline void expect_contains(const std::string& message,
                            std::initializer_list<std::string_view> parts) {
  EXPECT_FALSE(message.empty()) << "expected an error, but the input was accepted";
  for (std::string_view part : parts)
    EXPECT_NE(message.find(part), std::string::npos)
        << "error message lacks \"" << part << "\":\n  " << message;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A fresh folder under the system temp dir, removed when the test ends.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("tandem-gguf-" + std::to_string(::getpid()) + "-" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::vector<uint8_t> out(std::filesystem::file_size(path));
  std::FILE* f = std::fopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  if (!f) return {};
  EXPECT_EQ(std::fread(out.data(), 1, out.size(), f), out.size());
  std::fclose(f);
  return out;
}

inline void write_file_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  EXPECT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
}

// Deterministic filler bytes so data mix-ups between tensors are visible.
inline std::vector<uint8_t> pattern_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> out(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& byte : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    byte = uint8_t(x);
  }
  return out;
}

}  // namespace tandem::gguf::test
