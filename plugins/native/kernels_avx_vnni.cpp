// AVX-VNNI kernels (x86-64 with AVX2 and the VEX-encoded vpdpbusd on ymm): the nested linear of linear_ymm.h with
// one u8 x s8 dot instruction per 4 columns and 8 rows, the AVX2 set's kernels for everything else. The target's
// unsigned operand is its byte 16 base + refine = code + 136 (nothing to keep small: the non-saturating vpdpbusd
// sums four products of at most 255 x 127 into int32), and 136 sum(x) comes off once per group.
#include <algorithm>
#include <type_traits>

#include "native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "x86_avx2.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")

#include "linear_ymm.h"

namespace bitnest {
namespace {

inline __m256i dpbusd(__m256i acc, __m256i u8, __m256i s8) { return _mm256_dpbusd_avx_epi32(acc, u8, s8); }

struct VnniDraft {                     // nibbles (code + 8)
  static constexpr bool kTarget = false;
  static constexpr int kCorr = 8;
  struct W { __m256i lo, hi; };
  static W load(const uint8_t* b, const uint8_t*) {
    const __m256i low = _mm256_set1_epi8(0x0F), v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    return {_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16(v, 4), low)};
  }
  static __m256i dot(__m256i acc, const W& w, __m256i xl, __m256i xh) { return dpbusd(dpbusd(acc, w.lo, xl), w.hi, xh); }
};

struct VnniTarget {                    // bytes 16 base + refine (code + 136)
  static constexpr bool kTarget = true;
  static constexpr int kCorr = 136;
  struct W { __m256i lo, hi; };
  static W load(const uint8_t* b, const uint8_t* r) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i vr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r));
    return {_mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(vb, low), 4), _mm256_and_si256(vr, low)),
            _mm256_or_si256(_mm256_andnot_si256(low, vb), _mm256_and_si256(_mm256_srli_epi16(vr, 4), low))};
  }
  static __m256i dot(__m256i acc, const W& w, __m256i xl, __m256i xh) { return dpbusd(dpbusd(acc, w.lo, xl), w.hi, xh); }
};

void nested_linear_avx_vnni(const NestedLinear& w, bool target, const QActs& a, float* y, int ldy, int n0, int n1) {
  if (target)
    linear_ymm<VnniTarget>(w, target, a, y, ldy, n0, n1);
  else
    linear_ymm<VnniDraft>(w, target, a, y, ldy, n0, n1);
}

}  // namespace
}  // namespace bitnest

#pragma GCC pop_options

namespace bitnest {    // for any x86-64: runs before anyone knows whether this CPU has AVX-VNNI

const Kernels* avx_vnni_kernels() {
  if (!cpu_features().avx_vnni) return nullptr;
  static const Kernels k = [] {
    Kernels t = avx2_table();
    t.name = "avx-vnni", t.nested_linear = nested_linear_avx_vnni;
    return t;
  }();
  return &k;
}

}  // namespace bitnest

#else

namespace bitnest {
const Kernels* avx_vnni_kernels() { return nullptr; }
}  // namespace bitnest

#endif
