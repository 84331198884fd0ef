// AVX2 + FMA + F16C kernels (x86-64), chosen at run time where the CPU has them. Built without -mavx2: each
// function carries its own target attribute, so the rest of the library runs on any x86-64.
//
// Nested linear: 32 plane bytes hold 64 columns; the low nibbles are the even columns and the high nibbles the
// odd ones, which is the order quantize_acts() lays the activations in. _mm256_maddubs_epi16 multiplies the
// unsigned nibble (code + 8, in [0, 15]) by the signed INT8 activation and adds adjacent pairs into int16 (at most
// 2 * 15 * 127 = 3810 in magnitude, so a group of up to 256 columns sums exactly in int16); _mm256_madd_epi16
// widens to int32, where the target combines 16 * base + refine and the +8 offset is taken off as
// 8 (or 136) * sum(x) of the group. Each group's int32 lanes are exact; they are scaled in float32.
#include "native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "attend.h"

namespace bitnest {

#define BN_AVX2 __attribute__((target("avx2,fma,f16c")))

BN_AVX2 static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

BN_AVX2 static inline float half(uint16_t h) { return _cvtsh_ss(h); }

// One output row for MT tokens of the pass (the tokens are independent: each sees the same operations).
template <int MT, bool TARGET>
BN_AVX2 static inline void row_tile(const NestedLinear& w, const QActs& a, int m0, int n, float* y, int ldy) {
  const int K = w.K, G = w.G, ng = K / G, bpg = G / kBlock;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const uint8_t* b = w.base + size_t(n) * (K / 2);
  const uint8_t* r = TARGET ? w.refine + size_t(n) * (K / 2) : nullptr;
  const int corr = TARGET ? 136 : 8;
  __m256 acc[MT];
  float off[MT];
  for (int m = 0; m < MT; ++m) acc[m] = _mm256_setzero_ps(), off[m] = 0.f;
  for (int g = 0; g < ng; ++g) {
    __m256i s4[MT], sr[MT];
    for (int m = 0; m < MT; ++m) s4[m] = _mm256_setzero_si256(), sr[m] = _mm256_setzero_si256();
    for (int blk = g * bpg; blk < (g + 1) * bpg; ++blk) {
      const __m256i wb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + blk * (kBlock / 2)));
      const __m256i blo = _mm256_and_si256(wb, low), bhi = _mm256_and_si256(_mm256_srli_epi16(wb, 4), low);
      __m256i rlo, rhi;
      if (TARGET) {
        const __m256i wr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + blk * (kBlock / 2)));
        rlo = _mm256_and_si256(wr, low), rhi = _mm256_and_si256(_mm256_srli_epi16(wr, 4), low);
      }
      for (int m = 0; m < MT; ++m) {
        const int8_t* xq = a.xq + size_t(m0 + m) * K + blk * kBlock;
        const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
        const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + kBlock / 2));
        s4[m] = _mm256_add_epi16(s4[m], _mm256_add_epi16(_mm256_maddubs_epi16(blo, xe), _mm256_maddubs_epi16(bhi, xo)));
        if (TARGET)
          sr[m] = _mm256_add_epi16(sr[m], _mm256_add_epi16(_mm256_maddubs_epi16(rlo, xe), _mm256_maddubs_epi16(rhi, xo)));
      }
    }
    const float step = half(w.scale[size_t(n) * ng + g]) * (TARGET ? 1.f / 16.f : 1.f);
    const __m256 vstep = _mm256_set1_ps(step);
    for (int m = 0; m < MT; ++m) {
      const int32_t xs = a.xsum[size_t(m0 + m) * ng + g];
      __m256i i32 = _mm256_madd_epi16(s4[m], ones);
      if (TARGET) i32 = _mm256_add_epi32(_mm256_slli_epi32(i32, 4), _mm256_madd_epi16(sr[m], ones));
      i32 = _mm256_sub_epi32(i32, _mm256_setr_epi32(corr * xs, 0, 0, 0, 0, 0, 0, 0));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), vstep, acc[m]);
      if (w.offset) off[m] += half(w.offset[size_t(n) * ng + g]) * float(xs);
    }
  }
  for (int m = 0; m < MT; ++m) {
    float v = (hsum(acc[m]) + off[m]) * a.sx[m0 + m];
    if (w.bias) v += half(w.bias[n]);
    y[size_t(m0 + m) * ldy + n] = v;
  }
}

template <bool TARGET>
BN_AVX2 static void rows(const NestedLinear& w, const QActs& a, float* y, int ldy, int n0, int n1) {
  for (int n = n0; n < n1; ++n) {
    int m = 0;
    for (; m + 4 <= a.M; m += 4) row_tile<4, TARGET>(w, a, m, n, y, ldy);
    switch (a.M - m) {
      case 3: row_tile<3, TARGET>(w, a, m, n, y, ldy); break;
      case 2: row_tile<2, TARGET>(w, a, m, n, y, ldy); break;
      case 1: row_tile<1, TARGET>(w, a, m, n, y, ldy); break;
      default: break;
    }
  }
}

BN_AVX2 static void nested_linear_avx2(const NestedLinear& w, bool target, const QActs& a, float* y, int ldy, int n0,
                                       int n1) {
  if (target)
    rows<true>(w, a, y, ldy, n0, n1);
  else
    rows<false>(w, a, y, ldy, n0, n1);
}

template <int MT>
BN_AVX2 static inline void f16_tile(const uint16_t* row, int K, const float* x, int ldx, float* y, int ldy, int n) {
  __m256 acc[MT];
  for (int m = 0; m < MT; ++m) acc[m] = _mm256_setzero_ps();
  int k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
    for (int m = 0; m < MT; ++m) acc[m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + size_t(m) * ldx + k), acc[m]);
  }
  for (int m = 0; m < MT; ++m) {
    float v = hsum(acc[m]);
    for (int kk = k; kk < K; ++kk) v += half(row[kk]) * x[size_t(m) * ldx + kk];
    y[size_t(m) * ldy + n] = v;
  }
}

BN_AVX2 static void f16_linear_avx2(const uint16_t* w, int K, const float* x, int ldx, int M, float* y, int ldy,
                                    int n0, int n1) {
  for (int n = n0; n < n1; ++n) {
    const uint16_t* row = w + size_t(n) * K;
    int m = 0;
    for (; m + 4 <= M; m += 4) f16_tile<4>(row, K, x + size_t(m) * ldx, ldx, y + size_t(m) * ldy, ldy, n);
    for (; m < M; ++m) f16_tile<1>(row, K, x + size_t(m) * ldx, ldx, y + size_t(m) * ldy, ldy, n);
  }
}

BN_AVX2 static float dot_avx2(const float* a, const float* b, int n) {
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = hsum(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

BN_AVX2 static void axpy_avx2(float p, const float* x, float* y, int n) {
  const __m256 vp = _mm256_set1_ps(p);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vp, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += p * x[i];
}

BN_AVX2 static void attend_avx2(const KVLayer& kv, const KVRange& r, const float* q, int ldq, int hpk, int hkv, int t0,
                                int t1, float* out, int ldo, float* scores) {
  attend_with(dot_avx2, axpy_avx2, kv, r, q, ldq, hpk, hkv, t0, t1, out, ldo, scores);
}

const Kernels* avx2_kernels() {
  static const Kernels k{"avx2", nested_linear_avx2, f16_linear_avx2, attend_avx2};
  __builtin_cpu_init();
  const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok ? &k : nullptr;
}

}  // namespace bitnest

#else

namespace bitnest {
const Kernels* avx2_kernels() { return nullptr; }
}  // namespace bitnest

#endif
