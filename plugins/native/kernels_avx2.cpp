// AVX2 + FMA + F16C kernels (x86-64), chosen at run time where the CPU has them. The library is built without
// -mavx2: everything after the target pragma below (this file's own functions and the shared templates of
// linear_ymm.h and attend.h, which have internal linkage) is compiled for AVX2, the standard headers before it are not.
//
// Nested linear (linear_ymm.h) without a u8 x s8 dot instruction: _mm256_maddubs_epi16 multiplies unsigned bytes by
// signed INT8 activations and adds adjacent pairs into int16 with saturation, so its unsigned operand must stay
// small enough: the draft's nibbles (code + 8 in [0, 15]: pairs within 2 * 15 * 127); the target's 8-bit code as
// |code| against sign(x, code) where it fits int8 (the symmetric nest: pairs within 2 * 128 * 127 = 32512), else
// base and refinement nibbles apart (16 dot(x, base) + dot(x, refine)). _mm256_madd_epi16 widens pairs to int32.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "x86_avx2.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "attend.h"
#include "linear_ymm.h"

namespace bitnest {
namespace {

using namespace avx2;

inline __m256i low_nibbles() { return _mm256_set1_epi8(0x0F); }    // no vector constant at namespace scope: a
                                                                   // static initializer would run on any CPU
inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

struct Avx2Draft {                    // nibbles: dot(x, code + 8)
  static constexpr bool kTarget = false;
  static constexpr int kCorr = 8;
  struct W { __m256i lo, hi; };
  static W load(const uint8_t* b, const uint8_t*) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    return {_mm256_and_si256(v, low_nibbles()), _mm256_and_si256(_mm256_srli_epi16(v, 4), low_nibbles())};
  }
  static __m256i dot(__m256i acc, const W& w, __m256i xl, __m256i xh) {
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, xl), _mm256_maddubs_epi16(w.hi, xh));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
};

// The target's byte 16 base + refine (code + 136) of the even (lo: columns 8c..8c+3) and odd (hi) halves.
inline void target_bytes(const uint8_t* b, const uint8_t* r, __m256i* lo, __m256i* hi) {
  const __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  const __m256i vr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r));
  *lo = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(vb, low_nibbles()), 4), _mm256_and_si256(vr, low_nibbles()));
  *hi = _mm256_or_si256(_mm256_andnot_si256(low_nibbles(), vb), _mm256_and_si256(_mm256_srli_epi16(vr, 4), low_nibbles()));
}

struct Avx2TargetInt8 {               // |code| x sign(x, code): the exact dot(x, code), nothing to take off
  static constexpr bool kTarget = true;
  static constexpr int kCorr = 0;
  struct W { __m256i alo, slo, ahi, shi; };
  static W load(const uint8_t* b, const uint8_t* r) {
    __m256i lo, hi;
    target_bytes(b, r, &lo, &hi);
    const __m256i bias = _mm256_set1_epi8(char(136));
    const __m256i slo = _mm256_sub_epi8(lo, bias), shi = _mm256_sub_epi8(hi, bias);
    return {_mm256_abs_epi8(slo), slo, _mm256_abs_epi8(shi), shi};
  }
  static __m256i dot(__m256i acc, const W& w, __m256i xl, __m256i xh) {
    const __m256i one = _mm256_set1_epi16(1);
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w.alo, _mm256_sign_epi8(xl, w.slo)), one));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w.ahi, _mm256_sign_epi8(xh, w.shi)), one));
  }
};

struct Avx2TargetPlanes {             // 16 dot(x, base nibble) + dot(x, refine nibble), minus 136 sum(x)
  static constexpr bool kTarget = true;
  static constexpr int kCorr = 136;
  struct W { Avx2Draft::W b, r; };
  static W load(const uint8_t* b, const uint8_t* r) { return {Avx2Draft::load(b, nullptr), Avx2Draft::load(r, nullptr)}; }
  static __m256i dot(__m256i acc, const W& w, __m256i xl, __m256i xh) {
    const __m256i sb = _mm256_add_epi16(_mm256_maddubs_epi16(w.b.lo, xl), _mm256_maddubs_epi16(w.b.hi, xh));
    const __m256i sr = _mm256_add_epi16(_mm256_maddubs_epi16(w.r.lo, xl), _mm256_maddubs_epi16(w.r.hi, xh));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(sb, _mm256_set1_epi16(16)));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(sr, _mm256_set1_epi16(1)));
  }
};

void nested_linear_avx2(const NestedLinear& w, bool target, const QActs& a, float* y, int ldy, int n0, int n1) {
  if (!target)
    linear_ymm<Avx2Draft>(w, target, a, y, ldy, n0, n1);
  else if (w.int8_target)
    linear_ymm<Avx2TargetInt8>(w, target, a, y, ldy, n0, n1);
  else
    linear_ymm<Avx2TargetPlanes>(w, target, a, y, ldy, n0, n1);
}

// ---- float16 weights: every row's 8-column chunk converted once for all tokens of a tile ----
template <int MT>
void f16_tile(const uint16_t* row, int K, const float* x, int ldx, float* y, int ldy, int n) {
  __m256 acc[MT];
  for (int m = 0; m < MT; ++m) acc[m] = _mm256_setzero_ps();
  int k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
    for (int m = 0; m < MT; ++m) acc[m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + size_t(m) * ldx + k), acc[m]);
  }
  for (int m = 0; m < MT; ++m) {
    float v = hsum256(acc[m]);
    for (int kk = k; kk < K; ++kk) v += _cvtsh_ss(row[kk]) * x[size_t(m) * ldx + kk];
    y[size_t(m) * ldy + n] = v;
  }
}

void f16_linear_avx2(const uint16_t* w, int K, const float* x, int ldx, int M, float* y, int ldy, int n0, int n1) {
  for (int m0 = 0; m0 < M; m0 += kTokenTile)
    with_tile(std::min(kTokenTile, M - m0), [&](auto MT) {
      for (int n = n0; n < n1; ++n)
        f16_tile<decltype(MT)::value>(w + size_t(n) * K, K, x + size_t(m0) * ldx, ldx, y + size_t(m0) * ldy, ldy, n);
    });
}

struct Avx2Ops {
  static void dequant(const uint8_t* b, const uint8_t* rf, float s, int D, bool kv8, float* out) {
    dequant_kv(b, rf, s, D, kv8, out);
  }
  static void dots(const float* q, const float* k, int count, int D, float* out) { avx2::dots(q, k, count, D, out); }
  static void weighted_sum(float* out, const float* p, const float* v, int count, int D) {
    avx2::weighted_sum(out, p, v, count, D);
  }
  static void softmax(float* sc, int n) { avx2::softmax(sc, n); }
};

void attend_avx2(const KVLayer& kv, const KVRange& r, const AttendWork& u, const float* q, int ldq, int hpk, float* out,
                 int ldo, float* scores, float* kvbuf) {
  attend_unit<Avx2Ops>(kv, r, u, q, ldq, hpk, out, ldo, scores, kvbuf);
}

}  // namespace
}  // namespace bitnest

#pragma GCC pop_options

// The tables and the CPU check are built for any x86-64 (outside the target region): they run before anyone knows
// whether this CPU has AVX2.
namespace bitnest {

const Kernels& avx2_table() {
  static const Kernels k{"avx2", nested_linear_avx2, f16_linear_avx2, attend_avx2, avx2::quantize, avx2::silu_mul,
                         avx2::rms_norm, avx2::fwht, avx2::combine_rows, avx2::combine_signs, avx2::dot,
                         avx2::quantize_kv};
  return k;
}

const Kernels* avx2_kernels() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c ? &avx2_table() : nullptr;
}

}  // namespace bitnest

#else

namespace bitnest {
const Kernels* avx2_kernels() { return nullptr; }
}  // namespace bitnest

#endif
