// libFuzzer target for the GGUF reader (and, on inputs it accepts, the writer).
//
// Parsing alone would miss a reader that accepts a file and hands out pointers or sizes that
// are wrong, so everything parsed is touched: every metadata value, every byte of every
// tensor's data (ASan then sees any out-of-bounds pointer). Accepted inputs are also written
// back with GgufWriter and re-read; writing the result again must give identical bytes, which
// checks that reader and writer agree on the format and on what is valid.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "core/error.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"

namespace {

using tandem::gguf::Array;
using tandem::gguf::GgufFile;
using tandem::gguf::GgufWriter;
using tandem::gguf::TensorInfo;
using tandem::gguf::Value;

uint64_t touch(const Value& value) {
  uint64_t h = uint64_t(value.type());
  if (const std::string* s = value.as_string()) {
    for (char c : *s) h = h * 31 + uint8_t(c);
  } else if (const Array* a = value.as_array()) {
    h += uint64_t(a->elem_type);
    for (const Value& item : a->items) h = h * 7 + touch(item);
  } else if (const auto n = value.as_number()) {
    h += uint64_t(*n != 0);
  } else if (const auto b = value.as_bool()) {
    h += *b;
  }
  return h;
}

uint64_t touch(const GgufFile& file) {
  uint64_t h = file.version() + file.alignment() + file.total_file_bytes();
  for (const auto& [key, value] : file.metadata()) {
    h += key.size() + touch(value);
    if (file.find(key) != &value) std::abort();  // the index must agree with the list
  }
  for (const TensorInfo& t : file.tensors()) {
    if (file.find_tensor(t.name) != &t) std::abort();
    for (uint64_t i = 0; i < t.n_bytes; ++i) h += t.data[i];
  }
  // The typed getters on keys every model has, whatever their type here.
  try {
    h += file.get_string("general.architecture").size();
  } catch (const tandem::Error&) {
  }
  try {
    h += uint64_t(file.get_int("general.alignment"));
  } catch (const tandem::Error&) {
  }
  return h;
}

std::vector<uint8_t> rewrite(const GgufFile& file) {
  std::vector<uint8_t> out;
  GgufWriter writer(&out, file.alignment());
  for (const auto& [key, value] : file.metadata()) writer.add_metadata(key, value);
  for (const TensorInfo& t : file.tensors()) writer.add_tensor(t.name, t.type, t.shape);
  for (const TensorInfo& t : file.tensors()) writer.write_tensor_data(t.name, t.bytes());
  writer.finish();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<GgufFile> file;
  try {
    file.emplace(GgufFile::parse_memory(std::span(data, size), "fuzz.gguf"));
  } catch (const tandem::Error&) {
    return 0;  // rejected cleanly: that is the expected outcome for most inputs
  }
  volatile uint64_t sink = touch(*file);
  (void)sink;

  // Anything the reader accepts, the writer must be able to write, and the result must be
  // stable under another read/write cycle.
  try {
    const std::vector<uint8_t> once = rewrite(*file);
    const GgufFile reread = GgufFile::parse_memory(once, "rewritten.gguf");
    const std::vector<uint8_t> twice = rewrite(reread);
    if (once != twice) {
      std::fprintf(stderr, "gguf_fuzz: rewriting is not stable (%zu vs %zu bytes)\n", once.size(),
                   twice.size());
      std::abort();
    }
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "gguf_fuzz: the reader accepted a file the writer refuses: %s\n",
                 e.what());
    std::abort();
  }
  return 0;
}
