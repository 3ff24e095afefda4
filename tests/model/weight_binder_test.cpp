// WeightBinder's slices for head-split attention: rows() of a matrix in place, columns() copied
// block by block, from plain and from interleaved (`tandem repack`) layouts alike.
#include "model/weight_binder.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "quant/interleave.h"
#include "quant/quant.h"

namespace tandem {
namespace {

constexpr int64_t kRows = 32, kCols = 1024;  // two groups of 16 rows, four Q4_K blocks a row

// A file with the same random matrix as "plain" (Q4_K) and "packed" (Q4_K_R16), and the plain
// rows as floats (what both hold, dequantized).
struct Fixture {
  std::vector<uint8_t> image;
  std::vector<float> values;  // dequantized plain rows, [kRows, kCols]
  gguf::GgufFile file = make();

  gguf::GgufFile make() {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> source(size_t(kRows * kCols));
    for (float& v : source) v = normal(rng);
    const size_t row = row_bytes(DType::Q4_K, kCols);
    std::vector<uint8_t> plain(row * kRows), packed(row_bytes(DType::Q4_K_R16, kCols) * kRows);
    for (int64_t r = 0; r < kRows; ++r)
      quantize_row(DType::Q4_K, source.data() + r * kCols, plain.data() + r * row, kCols);
    for (int64_t g = 0; g < kRows / 16; ++g)
      interleave_rows(DType::Q4_K_R16, plain.data() + g * 16 * row, kCols,
                      packed.data() + g * 16 * row_bytes(DType::Q4_K_R16, kCols));
    values.resize(source.size());
    dequantize_row(DType::Q4_K, plain.data(), values.data(), kRows * kCols);
    {
      gguf::GgufWriter writer(&image);
      writer.add_tensor("plain", DType::Q4_K, {uint64_t(kCols), uint64_t(kRows)});
      writer.add_tensor("packed", DType::Q4_K_R16, {uint64_t(kCols), uint64_t(kRows)});
      writer.write_tensor_data("plain", plain);
      writer.write_tensor_data("packed", packed);
      writer.finish();
    }
    return gguf::GgufFile::parse_memory(image, "slices.gguf");
  }
};

std::vector<float> dequantized(const WeightView& view) {
  std::vector<float> out(size_t(view.rows * view.cols));
  for (int64_t r = 0; r < view.rows; ++r)
    dequantize_row(view.type, static_cast<const uint8_t*>(view.data) + r * view.row_bytes,
                   out.data() + r * view.cols, view.cols);
  return out;
}

TEST(WeightBinderSlices, ColumnsAreTheSameValuesFromPlainAndInterleavedRows) {
  Fixture f;
  cpu::CpuBackend cpu(1);
  WeightBinder binder(f.file, cpu);
  for (const char* name : {"plain", "packed"}) {
    const WeightView view = binder.columns(name, {kCols, kRows}, 512, 256, cpu);
    EXPECT_EQ(view.type, DType::Q4_K) << name;  // interleaved rows come back plain
    ASSERT_EQ(view.cols, 256);
    ASSERT_EQ(view.rows, kRows);
    const std::vector<float> got = dequantized(view);
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < 256; ++c)
        ASSERT_EQ(got[size_t(r * 256 + c)], f.values[size_t(r * kCols + 512 + c)]) << name << " " << r << "," << c;
  }
}

TEST(WeightBinderSlices, RowsAreInPlaceAndKeepWholeGroups) {
  Fixture f;
  cpu::CpuBackend cpu(1);
  WeightBinder binder(f.file, cpu);
  const WeightView rows = binder.rows("plain", {kCols, kRows}, 16, 8, cpu);
  EXPECT_EQ(rows.rows, 8);
  EXPECT_EQ(rows.data, static_cast<const uint8_t*>(f.file.find_tensor("plain")->data) + 16 * rows.row_bytes);
  const WeightView group = binder.rows("packed", {kCols, kRows}, 16, 16, cpu);
  EXPECT_EQ(group.type, DType::Q4_K_R16);
  try {
    (void)binder.rows("packed", {kCols, kRows}, 8, 8, cpu);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("groups of 16"), std::string::npos) << e.what();
  }
}

TEST(WeightBinderSlices, ColumnsThatCutABlockAreRefused) {
  Fixture f;
  cpu::CpuBackend cpu(1);
  WeightBinder binder(f.file, cpu);
  try {
    (void)binder.columns("plain", {kCols, kRows}, 128, 128, cpu);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cut its blocks of 256"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
