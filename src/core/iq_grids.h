#pragma once
// The lookup grids of the i-quant formats IQ1_S/IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S:
// each looks 8 (IQ1, IQ2) or 4 (IQ3) weights up at once in a grid of 256 to 2048 points of a
// lattice {levels}^n. Which points a grid holds was chosen by the formats' author from
// quantization statistics; no rule generates it, so iq_grid_bitmaps.inc stores that choice as
// one bit per lattice point (made by tools/gen-iq-grids.py from the format's definition in ggml,
// MIT licence). A grid's entry k is its k-th point in lattice order (element n-1 most
// significant), expanded here at compile time into the values the formats multiply: one byte
// per element, element j in byte j, so a kernel reads a point's 8 (or 4) weights with one load.
//
// The signs of IQ2_XXS, IQ2_XS and IQ3_XXS come as 7 bits per 8 weights; the eighth is the one
// that makes the number of minus signs even (kIqSigns, iq_sign_byte).
//
// CUDA kernels read device copies (every file nvcc compiles gets its own, 33 KiB); iq_grid_point
// reads the copy of the side it runs on.
#include <array>
#include <cstddef>
#include <cstdint>

#include "core/host_device.h"

namespace tandem {

#include "core/iq_grid_bitmaps.inc"

namespace iq_detail {

// The points of a grid, in lattice order, each packed as bytes: levels[i_j] in byte j.
template <class Word, int kPoints, int kElems, int kLevels, size_t kBitWords>
constexpr std::array<Word, kPoints> expand_grid(const uint64_t (&bits)[kBitWords],
                                                const int (&levels)[kLevels]) {
  std::array<Word, kPoints> points{};
  int lattice_size = 1;
  for (int j = 0; j < kElems; ++j) lattice_size *= kLevels;
  int k = 0;
  for (int index = 0; index < lattice_size && k < kPoints; ++index) {
    if (!((bits[index / 64] >> (index % 64)) & 1)) continue;
    Word packed = 0;
    int rest = index;
    for (int j = 0; j < kElems; ++j) {
      packed |= Word(uint8_t(levels[rest % kLevels])) << (8 * j);
      rest /= kLevels;
    }
    points[size_t(k++)] = packed;
  }
  return points;
}

inline constexpr int kIq2Levels[3] = {8, 25, 43};
inline constexpr int kIq3xxsLevels[8] = {4, 12, 20, 28, 36, 44, 52, 62};
inline constexpr int kIq3sLevels[8] = {1, 3, 5, 7, 9, 11, 13, 15};
inline constexpr int kIq1Levels[3] = {-1, 0, 1};

constexpr std::array<uint8_t, 128> iq_signs() {
  std::array<uint8_t, 128> signs{};
  for (int i = 0; i < 128; ++i) {
    int ones = 0;
    for (int b = 0; b < 7; ++b) ones += (i >> b) & 1;
    signs[size_t(i)] = uint8_t(i | ((ones & 1) << 7));
  }
  return signs;
}

}  // namespace iq_detail

// Unsigned grid values (IQ2: 8, 25, 43; IQ3_XXS: 4 ... 62; IQ3_S: 1 ... 15), one byte each.
inline constexpr auto kIq2xxsGrid =
    iq_detail::expand_grid<uint64_t, 256, 8>(kIq2xxsGridBits, iq_detail::kIq2Levels);
inline constexpr auto kIq2xsGrid =
    iq_detail::expand_grid<uint64_t, 512, 8>(kIq2xsGridBits, iq_detail::kIq2Levels);
inline constexpr auto kIq2sGrid =
    iq_detail::expand_grid<uint64_t, 1024, 8>(kIq2sGridBits, iq_detail::kIq2Levels);
inline constexpr auto kIq3xxsGrid =
    iq_detail::expand_grid<uint32_t, 256, 4>(kIq3xxsGridBits, iq_detail::kIq3xxsLevels);
inline constexpr auto kIq3sGrid =
    iq_detail::expand_grid<uint32_t, 512, 4>(kIq3sGridBits, iq_detail::kIq3sLevels);
// Signed values -1, 0, 1 as int8 bytes (0xFF for -1).
inline constexpr auto kIq1sGrid =
    iq_detail::expand_grid<uint64_t, 2048, 8>(kIq1sGridBits, iq_detail::kIq1Levels);

// 7 sign bits -> 8: bit j set means weight j of the 8 is negative.
inline constexpr auto kIqSigns = iq_detail::iq_signs();

// Grid IQ1_S/IQ1_M weights are the point's value plus or minus this shift.
inline constexpr float kIq1Delta = 0.125f;

// Every grid holds as many points as its format indexes (the bitmaps are not truncated).
static_assert(kIq2xxsGrid[255] != 0 && kIq2xsGrid[511] != 0 && kIq2sGrid[1023] != 0 &&
              kIq3xxsGrid[255] != 0 && kIq3sGrid[511] != 0 && kIq1sGrid[2047] != 0);
static_assert(kIq2xxsGrid[0] == 0x0808080808080808ull && kIq1sGrid[0] == ~0ull);

namespace iq_detail {

// A grid as a plain array: what a __device__ variable can be initialized with.
template <class Word, size_t N>
struct GridWords {
  Word v[N];
};

template <class Word, size_t N>
constexpr GridWords<Word, N> grid_words(const std::array<Word, N>& points) {
  GridWords<Word, N> words{};
  for (size_t k = 0; k < N; ++k) words.v[k] = points[k];
  return words;
}

}  // namespace iq_detail

enum class IqGrid { Iq2xxs, Iq2xs, Iq2s, Iq3xxs, Iq3s, Iq1s };

#if defined(__CUDACC__)
namespace iq_device {
static __device__ const auto kIq2xxs = iq_detail::grid_words(kIq2xxsGrid);
static __device__ const auto kIq2xs = iq_detail::grid_words(kIq2xsGrid);
static __device__ const auto kIq2s = iq_detail::grid_words(kIq2sGrid);
static __device__ const auto kIq3xxs = iq_detail::grid_words(kIq3xxsGrid);
static __device__ const auto kIq3s = iq_detail::grid_words(kIq3sGrid);
static __device__ const auto kIq1s = iq_detail::grid_words(kIq1sGrid);
}  // namespace iq_device
#endif

// Internal linkage: AVX-512 files include this header too (see core/iq_blocks.h).
namespace {  // NOLINT(google-build-namespaces)

// Point k of a grid, its bytes in a word (IQ3's 4-byte points in the low half).
template <IqGrid kGrid>
TANDEM_HD uint64_t iq_grid_point(uint32_t k) {
#if defined(__CUDA_ARCH__)
  if constexpr (kGrid == IqGrid::Iq2xxs) {
    return iq_device::kIq2xxs.v[k];
  } else if constexpr (kGrid == IqGrid::Iq2xs) {
    return iq_device::kIq2xs.v[k];
  } else if constexpr (kGrid == IqGrid::Iq2s) {
    return iq_device::kIq2s.v[k];
  } else if constexpr (kGrid == IqGrid::Iq3xxs) {
    return iq_device::kIq3xxs.v[k];
  } else if constexpr (kGrid == IqGrid::Iq3s) {
    return iq_device::kIq3s.v[k];
  } else {
    return iq_device::kIq1s.v[k];
  }
#else
  if constexpr (kGrid == IqGrid::Iq2xxs) {
    return kIq2xxsGrid[k];
  } else if constexpr (kGrid == IqGrid::Iq2xs) {
    return kIq2xsGrid[k];
  } else if constexpr (kGrid == IqGrid::Iq2s) {
    return kIq2sGrid[k];
  } else if constexpr (kGrid == IqGrid::Iq3xxs) {
    return kIq3xxsGrid[k];
  } else if constexpr (kGrid == IqGrid::Iq3s) {
    return kIq3sGrid[k];
  } else {
    return kIq1sGrid[k];
  }
#endif
}

// 7 sign bits and the eighth that makes the count of set bits even: computed on the device,
// looked up on the host (kIqSigns: IQ2_XS's row dot is 1.7x faster with the table).
TANDEM_HD uint32_t iq_sign_byte(uint32_t seven) {
#if defined(__CUDA_ARCH__)
  return seven | (__popc(seven) & 1) << 7;
#else
  return kIqSigns[seven];
#endif
}

}  // namespace

}  // namespace tandem
