// The AVX2 + FMA + F16C per-token kernels (x86_avx2.h): activation quantization, RMSNorm, SiLU * up, the fast
// Walsh-Hadamard butterflies, the small row products of the rotations (combine_rows) and dot, and the attention's pieces (KV dequantization, softmax). Built without
// -mavx2: the functions after the target pragma are AVX2, the standard headers before it are not.
#include <algorithm>
#include <cmath>

#include "native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "x86_avx2.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "combine_tiles.h"

namespace bitnest {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

inline int hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// exp(z) for z in [-88, 88] by range reduction (z = n ln2 + r) and a degree-6 polynomial of r (Cephes expf):
// within 2 ulp of libm's expf.
inline __m256 exp256(__m256 z) {
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

// 16 nibbles of 8 bytes (low, high, low, high ... in column order) as sign-extended int8 in column order.
inline __m128i nibbles_s8(__m128i bytes8) {
  const __m128i low = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  const __m128i lo = _mm_and_si128(bytes8, low), hi = _mm_and_si128(_mm_srli_epi16(bytes8, 4), low);
  const __m128i v = _mm_unpacklo_epi8(lo, hi);                      // columns 2j (lo), 2j + 1 (hi)
  return _mm_sub_epi8(_mm_xor_si128(v, eight), eight);              // (n ^ 8) - 8: the signed nibble
}

}  // namespace

namespace avx2 {

// Per-token INT8 codes as quantize_acts(): max|x|, then round_half_even(x / s) clamped, the same IEEE division;
// group sums of the codes (exact integers).
void quantize(const float* x, int ldx, int M, int K, int G, int8_t* xq, int32_t* xsum, float* sx) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int m = 0; m < M; ++m) {
    const float* xm = x + size_t(m) * ldx;
    int8_t* q = xq + size_t(m) * K;
    __m256 mx = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(xm + k), absmask));
    float amax = hmax(mx);
    for (; k < K; ++k) amax = std::fmax(amax, std::fabs(xm[k]));
    const float s = std::fmax(amax / 127.f, 1e-12f);
    sx[m] = s;
    const __m256 vs = _mm256_set1_ps(s), lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
    for (int g = 0; g < K / G; ++g) {
      __m256i gs = _mm256_setzero_si256();
      for (k = g * G; k < (g + 1) * G; k += 8) {   // G is a multiple of 64
        __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(xm + k), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i c = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
        gs = _mm256_add_epi32(gs, c);
        const __m128i c16 = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(q + k), _mm_packs_epi16(c16, c16));
      }
      xsum[size_t(m) * (K / G) + g] = hsum_epi32(gs);
    }
  }
}

void silu_mul(float* g, const float* u, int n) {
  const __m256 one = _mm256_set1_ps(1.f);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 z = _mm256_loadu_ps(g + i);
    const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), z));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(z, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

void rms_norm(const float* x, const uint16_t* w, int n, float eps, float* out) {
  __m256 ss8 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    ss8 = _mm256_fmadd_ps(v, v, ss8);
  }
  float ss = hsum(ss8);
  for (; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.f / std::sqrt(ss / float(n) + eps);
  const __m256 vinv = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv), wv));
  }
  for (; i < n; ++i) out[i] = x[i] * inv * _cvtsh_ss(w[i]);
}

// fwht_portable's butterflies (u + v, u - v) and final scaling, the same operations on every element: vectorized
// along `post` where it holds 8 floats, else (post = 1) along the transform with in-register butterflies for the
// strides 1, 2 and 4 (each lane computes what the portable loop computes for it).
void fwht(float* x, int pre, int f, int post) {
  if (!(post % 8 == 0 || (post == 1 && f % 8 == 0))) return fwht_portable(x, pre, f, post);
  const __m256 scale = _mm256_set1_ps(1.f / std::sqrt(float(f)));
  for (int p = 0; p < pre; ++p) {
    float* slab = x + size_t(p) * f * post;
    if (post == 1) {
      for (int i = 0; i < f; i += 8) {            // strides 1, 2, 4 inside each 8 floats
        __m256 v = _mm256_loadu_ps(slab + i);
        __m256 t = _mm256_permute_ps(v, 0xB1);     // swap neighbours
        v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xAA);
        t = _mm256_permute_ps(v, 0x4E);            // swap pairs
        v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xCC);
        t = _mm256_permute2f128_ps(v, v, 0x01);    // swap halves
        v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xF0);
        _mm256_storeu_ps(slab + i, v);
      }
      for (int h = 8; h < f; h *= 2)
        for (int i = 0; i < f; i += 2 * h)
          for (int j = i; j < i + h; j += 8) {
            const __m256 u = _mm256_loadu_ps(slab + j), v = _mm256_loadu_ps(slab + j + h);
            _mm256_storeu_ps(slab + j, _mm256_add_ps(u, v));
            _mm256_storeu_ps(slab + j + h, _mm256_sub_ps(u, v));
          }
    } else {
      for (int h = 1; h < f; h *= 2)
        for (int i = 0; i < f; i += 2 * h)
          for (int j = i; j < i + h; ++j) {
            float* a = slab + size_t(j) * post;
            float* b = slab + size_t(j + h) * post;
            for (int q = 0; q < post; q += 8) {
              const __m256 u = _mm256_loadu_ps(a + q), v = _mm256_loadu_ps(b + q);
              _mm256_storeu_ps(a + q, _mm256_add_ps(u, v));
              _mm256_storeu_ps(b + q, _mm256_sub_ps(u, v));
            }
          }
    }
    for (int i = 0; i < f * post; i += 8) _mm256_storeu_ps(slab + i, _mm256_mul_ps(_mm256_loadu_ps(slab + i), scale));
  }
}

namespace {
// ymm lanes for combine_tiles.h: at most 8 accumulators, with the inputs and a broadcast within 16 registers
struct Ymm {
  using reg = __m256;
  static constexpr int kLanes = 8, kAccumulators = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static reg set1(float v) { return _mm256_set1_ps(v); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
};

// Whole ymm columns, then the portable loop for the last n % 8 (each output value is the same sequence of roundings
// whichever way its column is reached).
template <bool FUSED>
void combine(const float* c, int cb, int ci, int B, int I, const float* in, int ldin, int n, float* out, int ldout) {
  const int j = combine_registers<Ymm, FUSED>(c, cb, ci, B, I, in, ldin, n, out, ldout);
  if (j < n) combine_rows_portable(c, cb, ci, B, I, in + j, ldin, n - j, out + j, ldout);
}
}  // namespace

void combine_rows(const float* c, int cb, int ci, int B, int I, const float* in, int ldin, int n, float* out,
                  int ldout) {
  combine<false>(c, cb, ci, B, I, in, ldin, n, out, ldout);
}

void combine_signs(const float* c, int cb, int ci, int B, int I, const float* in, int ldin, int n, float* out,
                   int ldout) {
  combine<true>(c, cb, ci, B, I, in, ldin, n, out, ldout);
}

float dot(const float* a, const float* b, int n) {
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = hsum(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// dequant_kv_portable's values: the integer code (16 q4 + qr, or q4) converted, times s / 16 (or s): one rounding.
void dequant_kv(const uint8_t* b, const uint8_t* rf, float s, int D, bool kv8, float* out) {
  if (D % 16) {                                    // every model here has D a multiple of 16: the scalar form
    for (int j = 0; j < D / 2; ++j) {
      const int l = int8_t(b[j] << 4) >> 4, h = int8_t(b[j]) >> 4;
      const int rl = kv8 ? int8_t(rf[j] << 4) >> 4 : 0, rh = kv8 ? int8_t(rf[j]) >> 4 : 0;
      out[2 * j] = kv8 ? float(16 * l + rl) * (s / 16.f) : float(l) * s;
      out[2 * j + 1] = kv8 ? float(16 * h + rh) * (s / 16.f) : float(h) * s;
    }
    return;
  }
  const __m256 step = _mm256_set1_ps(kv8 ? s / 16.f : s);
  for (int j = 0; j < D / 2; j += 8) {             // 8 bytes: 16 values
    __m256i c = _mm256_cvtepi8_epi16(nibbles_s8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + j))));
    if (kv8) {
      const __m256i r = _mm256_cvtepi8_epi16(nibbles_s8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rf + j))));
      c = _mm256_add_epi16(_mm256_slli_epi16(c, 4), r);
    }
    const __m256i lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(c));
    const __m256i hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(c, 1));
    _mm256_storeu_ps(out + 2 * j, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), step));
    _mm256_storeu_ps(out + 2 * j + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), step));
  }
}

void softmax(float* sc, int n) {
  __m256 mx8 = _mm256_set1_ps(sc[0]);
  int i = 0;
  for (; i + 8 <= n; i += 8) mx8 = _mm256_max_ps(mx8, _mm256_loadu_ps(sc + i));
  float mx = hmax(mx8);
  for (; i < n; ++i) mx = std::fmax(mx, sc[i]);
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 sum8 = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + i), vmx));
    _mm256_storeu_ps(sc + i, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  float sum = hsum(sum8);
  for (; i < n; ++i) sum += (sc[i] = std::exp(sc[i] - mx));
  const __m256 inv = _mm256_set1_ps(1.f / sum);
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(sc + i, _mm256_mul_ps(_mm256_loadu_ps(sc + i), inv));
  for (; i < n; ++i) sc[i] *= 1.f / sum;
}

// Eight rows at a time: per row 8 lanes of partial sums over D, then one transposed reduction of the eight (each
// row's lanes summed by the same tree: (l0 + l1) + (l2 + l3), then + (l4 + l5) + (l6 + l7) as laid out below). A row
// outside a whole group of eight is computed in a group padded with copies of the first row: the same tree.
void dots(const float* q, const float* k, int count, int D, float* out) {
  if (D % 8) {
    for (int i = 0; i < count; ++i) {
      float acc = 0.f;
      for (int d = 0; d < D; ++d) acc += q[d] * k[size_t(i) * D + d];
      out[i] = acc;
    }
    return;
  }
  for (int i0 = 0; i0 < count; i0 += 8) {
    const float* rows[8];
    for (int r = 0; r < 8; ++r) rows[r] = k + size_t(i0 + (i0 + r < count ? r : 0)) * D;
    __m256 a[8];
    for (int r = 0; r < 8; ++r) a[r] = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      for (int r = 0; r < 8; ++r) a[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[r] + d), a[r]);
    }
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);     // [r0..r3 | r0..r3] halves, r4..r7
    const __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, s);
    for (int r = 0; r < 8 && i0 + r < count; ++r) out[i0 + r] = tmp[r];
  }
}

void weighted_sum(float* out, const float* p, const float* v, int count, int D) {
  if (D % 8) {
    for (int i = 0; i < count; ++i)
      for (int d = 0; d < D; ++d) out[d] += p[i] * v[size_t(i) * D + d];
    return;
  }
  for (int d0 = 0; d0 < D; d0 += 64) {          // up to 8 registers of the output, kept across the positions
    const int nv = std::min(8, (D - d0) / 8);
    __m256 o[8];
    for (int c = 0; c < nv; ++c) o[c] = _mm256_loadu_ps(out + d0 + 8 * c);
    for (int i = 0; i < count; ++i) {
      const __m256 pi = _mm256_set1_ps(p[i]);
      const float* vi = v + size_t(i) * D + d0;
      for (int c = 0; c < nv; ++c) o[c] = _mm256_fmadd_ps(pi, _mm256_loadu_ps(vi + 8 * c), o[c]);
    }
    for (int c = 0; c < nv; ++c) _mm256_storeu_ps(out + d0 + 8 * c, o[c]);
  }
}

// quantize_kv_vector()'s bytes: the same IEEE divisions, round-half-even and clamps, 8 values at a time; the scale
// rounded to float16 by F16C (round to nearest even, as f32_to_f16).
void quantize_kv(const float* x, int D, uint8_t* base, uint8_t* refine, uint16_t* scale) {
  if (D % 8) return quantize_kv_vector(x, D, base, refine, scale);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 mx = _mm256_setzero_ps();
  for (int d = 0; d < D; d += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(x + d), absmask));
  const uint16_t h = uint16_t(_cvtss_sh(std::fmax(hmax(mx) / 7.f, 5.9604644775390625e-08f), _MM_FROUND_TO_NEAREST_INT));
  *scale = h;
  const float sf = _cvtsh_ss(h);
  const __m256 s = _mm256_set1_ps(sf), step = _mm256_set1_ps(sf / 16.f);
  const __m256 lo = _mm256_set1_ps(-8.f), hi = _mm256_set1_ps(7.f);
  constexpr int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int d = 0; d < D; d += 8) {
    const __m256 v = _mm256_loadu_ps(x + d);
    const __m256 a = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(_mm256_div_ps(v, s), rnd), lo), hi);
    const __m256 r = _mm256_sub_ps(v, _mm256_mul_ps(a, s));
    const __m256 q = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(_mm256_div_ps(r, step), rnd), lo), hi);
    // nibbles of 8 values: pairs (2j, 2j + 1) into bytes, low nibble first
    const __m256i qa = _mm256_and_si256(_mm256_cvtps_epi32(a), _mm256_set1_epi32(0xF));
    const __m256i qq = _mm256_and_si256(_mm256_cvtps_epi32(q), _mm256_set1_epi32(0xF));
    alignas(32) int32_t ca[8], cq[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(ca), qa);
    _mm256_store_si256(reinterpret_cast<__m256i*>(cq), qq);
    for (int j = 0; j < 4; ++j) {
      base[(d >> 1) + j] = uint8_t(ca[2 * j] | ca[2 * j + 1] << 4);
      refine[(d >> 1) + j] = uint8_t(cq[2 * j] | cq[2 * j + 1] << 4);
    }
  }
}

}  // namespace avx2
}  // namespace bitnest

#pragma GCC pop_options

#endif
