#include "backends/cpu/cpu_features.h"

#include <cpuid.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace tandem::cpu {
namespace {

// clang 14's __builtin_cpu_supports does not know "f16c"; CPUID leaf 1 has it in ECX. (The
// OS-saved-state check that matters comes with "avx2" from the builtin.)
bool cpu_has_f16c() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

CpuIsa detect() {
  __builtin_cpu_init();
  const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  if (!avx2) return CpuIsa::Portable;
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vnni") &&
                      __builtin_cpu_supports("avx512bf16") &&
                      __builtin_cpu_supports("avx512vbmi") &&
                      __builtin_cpu_supports("avx512bitalg") && __builtin_cpu_supports("bmi2");
  return avx512 ? CpuIsa::Avx512 : CpuIsa::Avx2;
}

CpuIsa choose() {
  const CpuIsa detected = detected_cpu_isa();
  const char* requested = std::getenv("TANDEM_ISA");
  if (requested == nullptr || *requested == '\0') return detected;
  const std::optional<CpuIsa> isa = parse_cpu_isa(requested);
  if (!isa) fail("TANDEM_ISA={}: unknown instruction set; use portable, avx2 or avx512", requested);
  if (!cpu_supports(*isa))
    fail(
        "TANDEM_ISA={}: this CPU does not support it (best available: {}); unset TANDEM_ISA or "
        "pick a lower level",
        requested, cpu_isa_name(detected));
  return *isa;
}

}  // namespace

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Portable:
      return "portable";
    case CpuIsa::Avx2:
      return "avx2";
    case CpuIsa::Avx512:
      return "avx512";
  }
  return "unknown";
}

std::optional<CpuIsa> parse_cpu_isa(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::Portable, CpuIsa::Avx2, CpuIsa::Avx512})
    if (cpu_isa_name(isa) == name) return isa;
  return std::nullopt;
}

bool cpu_supports(CpuIsa isa) {
  return int(isa) <= int(detected_cpu_isa());
}

CpuIsa detected_cpu_isa() {
  static const CpuIsa detected = detect();
  return detected;
}

CpuIsa best_cpu_isa() {
  static const CpuIsa chosen = choose();
  return chosen;
}

std::vector<CpuIsa> supported_cpu_isas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::Portable, CpuIsa::Avx2, CpuIsa::Avx512})
    if (cpu_supports(isa)) isas.push_back(isa);
  return isas;
}

}  // namespace tandem::cpu
