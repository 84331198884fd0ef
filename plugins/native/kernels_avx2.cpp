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

#include <cmath>

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

// One output row for MT tokens of the pass (the tokens are independent: each sees the same operations, so a row
// does not depend on how many tokens share its tile). BPG = blocks of 64 columns per group; the loop bounds are
// compile-time so the block loop unrolls and nothing but vector work sits in the inner loop.
template <int MT, bool TARGET, int BPG>
BN_AVX2 static inline void row_tile(const uint8_t* b, const uint8_t* r, const uint16_t* scale, int ng,
                                    const int8_t* const* xq, const int32_t* const* xs, float* out) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  constexpr int corr = TARGET ? 136 : 8;                  // 16 * 8 + 8, or 8: the +8 of every nibble
  constexpr int bytes = BPG * kBlock / 2;
  __m256 acc[MT];
  for (int m = 0; m < MT; ++m) acc[m] = _mm256_setzero_ps();
  for (int g = 0; g < ng; ++g, b += bytes, r += TARGET ? bytes : 0) {
    __m256i s4[MT], sr[MT];
    for (int m = 0; m < MT; ++m) s4[m] = _mm256_setzero_si256(), sr[m] = _mm256_setzero_si256();
    for (int blk = 0; blk < BPG; ++blk) {
      const __m256i wb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + blk * (kBlock / 2)));
      const __m256i blo = _mm256_and_si256(wb, low), bhi = _mm256_and_si256(_mm256_srli_epi16(wb, 4), low);
      __m256i rlo = blo, rhi = bhi;
      if (TARGET) {
        const __m256i wr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + blk * (kBlock / 2)));
        rlo = _mm256_and_si256(wr, low), rhi = _mm256_and_si256(_mm256_srli_epi16(wr, 4), low);
      }
      const int col = (g * BPG + blk) * kBlock;
      for (int m = 0; m < MT; ++m) {
        const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[m] + col));
        const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[m] + col + kBlock / 2));
        s4[m] = _mm256_add_epi16(s4[m], _mm256_add_epi16(_mm256_maddubs_epi16(blo, xe), _mm256_maddubs_epi16(bhi, xo)));
        if (TARGET)
          sr[m] = _mm256_add_epi16(sr[m], _mm256_add_epi16(_mm256_maddubs_epi16(rlo, xe), _mm256_maddubs_epi16(rhi, xo)));
      }
    }
    const __m256 step = _mm256_set1_ps(half(scale[g]) * (TARGET ? 1.f / 16.f : 1.f));
    for (int m = 0; m < MT; ++m) {
      __m256i i32 = _mm256_madd_epi16(s4[m], ones);
      if (TARGET) i32 = _mm256_add_epi32(_mm256_slli_epi32(i32, 4), _mm256_madd_epi16(sr[m], ones));
      i32 = _mm256_sub_epi32(i32, _mm256_castsi128_si256(_mm_cvtsi32_si128(corr * xs[m][g])));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), step, acc[m]);
    }
  }
  for (int m = 0; m < MT; ++m) out[m] = hsum(acc[m]);
}

// The target where its 8-bit code fits int8 (NestedLinear::int8_target): per block the code c = 16 q4 + qr is
// formed once from both planes (high nibble: base, low nibble: refine, minus 136 for the two +8 offsets), then
// each token takes one u8 x s8 product per column, |c| against sign(x, c): at most 128 * 127 per product, 32512
// per pair, widened to int32 at once. No offset to take off and one scale multiply per group.
template <int MT, int BPG>
BN_AVX2 static inline void row_tile_int8(const uint8_t* b, const uint8_t* r, const uint16_t* scale, int ng,
                                         const int8_t* const* xq, float* out) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), bias = _mm256_set1_epi8(char(136));
  constexpr int bytes = BPG * kBlock / 2;
  __m256 acc[MT];
  for (int m = 0; m < MT; ++m) acc[m] = _mm256_setzero_ps();
  for (int g = 0; g < ng; ++g, b += bytes, r += bytes) {
    __m256i s[MT];
    for (int m = 0; m < MT; ++m) s[m] = _mm256_setzero_si256();
    for (int blk = 0; blk < BPG; ++blk) {
      const __m256i wb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + blk * (kBlock / 2)));
      const __m256i wr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + blk * (kBlock / 2)));
      // even columns: base low nibble over refine low nibble; odd columns: the high nibbles
      const __m256i ce = _mm256_sub_epi8(_mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(wb, low), 4),
                                                         _mm256_and_si256(wr, low)), bias);
      const __m256i co = _mm256_sub_epi8(_mm256_or_si256(_mm256_andnot_si256(low, wb),
                                                         _mm256_and_si256(_mm256_srli_epi16(wr, 4), low)), bias);
      const __m256i ae = _mm256_abs_epi8(ce), ao = _mm256_abs_epi8(co);
      const int col = (g * BPG + blk) * kBlock;
      for (int m = 0; m < MT; ++m) {
        const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[m] + col));
        const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[m] + col + kBlock / 2));
        const __m256i pe = _mm256_madd_epi16(_mm256_maddubs_epi16(ae, _mm256_sign_epi8(xe, ce)), ones);
        const __m256i po = _mm256_madd_epi16(_mm256_maddubs_epi16(ao, _mm256_sign_epi8(xo, co)), ones);
        s[m] = _mm256_add_epi32(s[m], _mm256_add_epi32(pe, po));
      }
    }
    const __m256 step = _mm256_set1_ps(half(scale[g]) * (1.f / 16.f));
    for (int m = 0; m < MT; ++m) acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[m]), step, acc[m]);
  }
  for (int m = 0; m < MT; ++m) out[m] = hsum(acc[m]);
}

// Rows [n0, n1) for tokens [m0, m0 + MT).
template <int MT, bool TARGET, int BPG>
BN_AVX2 static void tile_rows(const NestedLinear& w, const QActs& a, int m0, float* y, int ldy, int n0, int n1) {
  const int K = w.K, ng = K / w.G;
  const int8_t* xq[MT];
  const int32_t* xs[MT];
  for (int m = 0; m < MT; ++m) xq[m] = a.xq + size_t(m0 + m) * K, xs[m] = a.xsum + size_t(m0 + m) * ng;
  for (int n = n0; n < n1; ++n) {
    float out[MT];
    if (TARGET && w.int8_target)
      row_tile_int8<MT, BPG>(w.base + size_t(n) * (K / 2), w.refine + size_t(n) * (K / 2), w.scale + size_t(n) * ng, ng,
                             xq, out);
    else
      row_tile<MT, TARGET, BPG>(w.base + size_t(n) * (K / 2), TARGET ? w.refine + size_t(n) * (K / 2) : nullptr,
                                w.scale + size_t(n) * ng, ng, xq, xs, out);
    for (int m = 0; m < MT; ++m) {
      float off = 0.f;
      if (w.offset)                                      // top4of8: + offset * sum(x) per group
        for (int g = 0; g < ng; ++g) off += half(w.offset[size_t(n) * ng + g]) * float(xs[m][g]);
      float v = (out[m] + off) * a.sx[m0 + m];
      if (w.bias) v += half(w.bias[n]);
      y[size_t(m0 + m) * ldy + n] = v;
    }
  }
}

// Rows in blocks small enough to stay in L1 (16 rows of at most 2 x 768 plane bytes) while every token tile reads
// them, so a pass of M tokens sweeps the weights once; tokens in tiles of up to 4 (3 for the two-plane target, whose
// planes take more registers), then the rest. A token's arithmetic is the same in any tile (M-invariance).
template <bool TARGET, int BPG>
BN_AVX2 static void rows(const NestedLinear& w, const QActs& a, float* y, int ldy, int n0, int n1) {
  constexpr int kRowBlock = 16;
  const int T = TARGET && !w.int8_target ? 3 : 4;
  for (int nb = n0; nb < n1; nb += kRowBlock) {
    const int ne = std::min(n1, nb + kRowBlock);
    int m = 0;
    for (; m + T <= a.M; m += T) {
      if (T == 4)
        tile_rows<4, TARGET, BPG>(w, a, m, y, ldy, nb, ne);
      else
        tile_rows<3, TARGET, BPG>(w, a, m, y, ldy, nb, ne);
    }
    switch (a.M - m) {
      case 3: tile_rows<3, TARGET, BPG>(w, a, m, y, ldy, nb, ne); break;
      case 2: tile_rows<2, TARGET, BPG>(w, a, m, y, ldy, nb, ne); break;
      case 1: tile_rows<1, TARGET, BPG>(w, a, m, y, ldy, nb, ne); break;
      default: break;
    }
  }
}

template <bool TARGET>
BN_AVX2 static void rows_by_group(const NestedLinear& w, const QActs& a, float* y, int ldy, int n0, int n1) {
  switch (w.G / kBlock) {
    case 1: rows<TARGET, 1>(w, a, y, ldy, n0, n1); break;
    case 2: rows<TARGET, 2>(w, a, y, ldy, n0, n1); break;
    case 3: rows<TARGET, 3>(w, a, y, ldy, n0, n1); break;
    default: rows<TARGET, 4>(w, a, y, ldy, n0, n1); break;
  }
}

BN_AVX2 static void nested_linear_avx2(const NestedLinear& w, bool target, const QActs& a, float* y, int ldy, int n0,
                                       int n1) {
  if (target)
    rows_by_group<true>(w, a, y, ldy, n0, n1);
  else
    rows_by_group<false>(w, a, y, ldy, n0, n1);
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

// Per-token INT8 codes as quantize_acts(): max|x|, then round_half_even(x / s) clamped, the same IEEE division.
BN_AVX2 static void quantize_avx2(const float* x, int ldx, int M, int K, int G, int8_t* xq, int32_t* xsum, float* sx) {
  alignas(32) int32_t codes[4096];
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int m = 0; m < M; ++m) {
    const float* xm = x + size_t(m) * ldx;
    if (K > 4096) {                                       // wider than any model here: the portable path
      quantize_acts(xm, ldx, 1, K, G, xq + size_t(m) * K, xsum + size_t(m) * (K / G), sx + m);
      continue;
    }
    __m256 mx = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(xm + k), absmask));
    __m128 h4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h4 = _mm_max_ps(h4, _mm_movehl_ps(h4, h4));
    float amax = _mm_cvtss_f32(_mm_max_ss(h4, _mm_movehdup_ps(h4)));
    for (; k < K; ++k) amax = std::fmax(amax, std::fabs(xm[k]));
    const float s = std::fmax(amax / 127.f, 1e-12f);
    sx[m] = s;
    const __m256 vs = _mm256_set1_ps(s), lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
    for (k = 0; k + 8 <= K; k += 8) {
      __m256 q = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(xm + k), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + k), _mm256_cvtps_epi32(q));
    }
    for (; k < K; ++k) codes[k] = int(std::fmin(std::fmax(std::nearbyint(xm[k] / s), -127.f), 127.f));
    place_codes(codes, K, G, xq + size_t(m) * K, xsum + size_t(m) * (K / G));
  }
}

// exp(z) for z in [-88, 88] by range reduction (z = n ln2 + r) and a degree-6 polynomial of r (Cephes expf):
// within 2 ulp of libm's expf; silu(z) = z / (1 + exp(-z)).
BN_AVX2 static inline __m256 exp256(__m256 z) {
  z = _mm256_min_ps(_mm256_max_ps(z, _mm256_set1_ps(-88.f)), _mm256_set1_ps(88.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(z, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), z);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

BN_AVX2 static void silu_mul_avx2(float* g, const float* u, int n) {
  const __m256 one = _mm256_set1_ps(1.f);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 z = _mm256_loadu_ps(g + i);
    const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), z));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(z, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

const Kernels* avx2_kernels() {
  static const Kernels k{"avx2", nested_linear_avx2, f16_linear_avx2, attend_avx2, quantize_avx2, silu_mul_avx2};
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
