// What this CPU and its operating system support, read once: CPUID for the instruction sets and XCR0 (xgetbv) for
// the register state the OS saves on a context switch (AVX: xmm/ymm; AVX-512: opmask and all 32 zmm). An
// instruction set is usable only where both say so: a CPU with AVX-512 under an OS (or hypervisor) that does not
// save zmm state must not run zmm code.
#include "native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

namespace bitnest {

#if defined(__x86_64__) || defined(_M_X64)
static uint64_t xcr0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

static CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28);
  const bool fma = c & (1u << 12), f16c = c & (1u << 29);
  if (!osxsave || !avx) return f;
  const uint64_t x = xcr0();
  const bool ymm_state = (x & 0x6) == 0x6;                 // SSE and AVX state
  const bool zmm_state = ymm_state && (x & 0xE0) == 0xE0;  // opmask, ZMM_Hi256, Hi16_ZMM
  if (!ymm_state || __get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = b & (1u << 5);
  const bool avx512f = b & (1u << 16), avx512bw = b & (1u << 30), avx512vl = b & (1u << 31);
  const bool avx512vnni = c & (1u << 11);
  __cpuid_count(7, 1, a, b, c, d);
  const bool avxvnni = a & (1u << 4);
  f.avx2 = avx2, f.fma = fma, f.f16c = f16c;
  f.avx_vnni = avx2 && fma && f16c && avxvnni;
  f.avx512 = avx2 && fma && f16c && zmm_state && avx512f && avx512bw && avx512vl;
  f.avx512_vnni = f.avx512 && avx512vnni;
  return f;
}
#else
static CpuFeatures detect() { return CpuFeatures{}; }
#endif

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace bitnest
