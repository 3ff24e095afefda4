#pragma once
// Which x86 vector instruction set the CPU kernels use. Detected once from CPUID; the
// TANDEM_ISA environment variable (portable | avx2 | avx512) can pick a lower one, for
// comparisons and for ruling out a kernel when a result looks wrong.
#include <optional>
#include <string_view>
#include <vector>

namespace tandem::cpu {

// Ordered: each level implies the ones before it.
//   Avx2:   AVX2 + FMA + F16C
//   Avx512: Avx2 + AVX-512 F, BW, VL, DQ, VNNI, BF16, VBMI, BITALG, and BMI2 (Zen 4 and later,
//           Sapphire Rapids and later; Cooper Lake, without VBMI, and Ice Lake, without BF16,
//           take Avx2)
enum class CpuIsa { Portable, Avx2, Avx512 };

std::string_view cpu_isa_name(CpuIsa isa);  // "portable", "avx2", "avx512"
std::optional<CpuIsa> parse_cpu_isa(std::string_view name);

// Whether this CPU can run the kernels of `isa`.
bool cpu_supports(CpuIsa isa);

// The best level the hardware offers, ignoring TANDEM_ISA.
CpuIsa detected_cpu_isa();

// The level the kernels use: detected_cpu_isa(), or TANDEM_ISA when set. Decided on the first
// call. Throws tandem::Error when TANDEM_ISA names an unknown level or one the CPU lacks.
CpuIsa best_cpu_isa();

// Every level this CPU supports, lowest first (for tests and benchmarks).
std::vector<CpuIsa> supported_cpu_isas();

}  // namespace tandem::cpu
