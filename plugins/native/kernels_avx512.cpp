// AVX-512 VNNI kernels (x86-64 with AVX-512 F/BW/VL and VNNI, and an OS that saves zmm state: cpu_features.cpp):
// the nested linear on whole 16-row blocks, one zmm of int32 lanes per token, vpdpbusd with the activation dword
// broadcast from memory; the AVX2 set's kernels for everything else. Unpacking a 64-byte chunk (16 rows x 8
// columns) takes two shifts and two bit selects (vpternlogd) for the target's bytes 16 base + refine = code + 136,
// then every token of the tile costs two vpdpbusd per chunk; 136 (or 8) sum(x) comes off once per group.
#include <algorithm>
#include <type_traits>

#include "native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "x86_avx2.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
// GCC 12 warns of _mm512_undefined_ps() inside its own conversion intrinsics (a false positive of its headers)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "combine_tiles.h"
#include "linear_tiles.h"

namespace bitnest {
namespace {

// Rows [nb[p], nb[p] + 16) of P blocks for tokens [m0, m0 + MT): nested_linear_rows' operations, 16 rows a lane
// each. P = 2 (the draft's one-token pass) walks two blocks far apart in step, so a thread reads two plane streams at
// once, as the target view's base and refinement planes are: with one stream a thread, a one-token draft pass
// streamed its planes at about half the target's rate.
template <bool TARGET, int MT, int P = 1>
void block16(const NestedLinear& w, const QActs& a, const int* nb, int m0, float* y, int ldy) {
  constexpr int corr = TARGET ? 136 : 8;
  const int K = w.K, ng = K / w.G, cpg = w.G / kChunk;
  const uint8_t* B[P];
  const uint8_t* F[P];
  const uint16_t* S[P];
  const uint16_t* O[P];
  for (int p = 0; p < P; ++p) {
    B[p] = w.base + size_t(nb[p]) * (K / 2), F[p] = TARGET ? w.refine + size_t(nb[p]) * (K / 2) : nullptr;
    S[p] = w.scale + size_t(nb[p]) * ng, O[p] = w.offset ? w.offset + size_t(nb[p]) * ng : nullptr;
  }
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8(char(0xF0));
  const __m512 sixteenth = _mm512_set1_ps(TARGET ? 1.f / 16.f : 1.f);
  const int8_t* x[MT];
  const int32_t* xs[MT];
  __m512 acc[P][MT], off[P][MT];
  for (int m = 0; m < MT; ++m) {
    x[m] = a.xq + size_t(m0 + m) * K, xs[m] = a.xsum + size_t(m0 + m) * ng;
    for (int p = 0; p < P; ++p) acc[p][m] = _mm512_setzero_ps(), off[p][m] = _mm512_setzero_ps();
  }
  // NA independent int32 accumulators per token (its lo and hi dot products, and alternate chunks for small tiles):
  // a vpdpbusd waits ~4-5 cycles for its accumulator, so one chain per token left a one-token pass latency-bound.
  constexpr int NA = MT * P >= 5 ? 2 : MT * P >= 3 ? 4 : P == 2 ? 4 : 8;
  for (int g = 0; g < ng; ++g) {
    __m512i dot[P][MT][NA];
    for (int p = 0; p < P; ++p)
      for (int m = 0; m < MT; ++m) {
        dot[p][m][0] = _mm512_set1_epi32(-corr * xs[m][g]);
        for (int i = 1; i < NA; ++i) dot[p][m][i] = _mm512_setzero_si512();
      }
    for (int c0 = g * cpg; c0 < (g + 1) * cpg; c0 += NA / 2)     // cpg is a multiple of 8: NA / 2 divides it
      for (int u = 0; u < NA / 2; ++u) {                            // unrolled: accumulators stay in registers
        const int c = c0 + u;
        for (int p = 0; p < P; ++p) {
          prefetch(B[p] + size_t(c) * 64);
          if (TARGET) prefetch(F[p] + size_t(c) * 64);
          const __m512i vb = _mm512_loadu_si512(B[p] + size_t(c) * 64);
          __m512i lo, hi;
          if (TARGET) {   // bit select 0xE4: (a & c) | (b & ~c) with c = 0xF0 in every byte
            const __m512i vr = _mm512_loadu_si512(F[p] + size_t(c) * 64);
            lo = _mm512_ternarylogic_epi32(_mm512_slli_epi16(vb, 4), vr, high, 0xE4);
            hi = _mm512_ternarylogic_epi32(vb, _mm512_srli_epi16(vr, 4), high, 0xE4);
          } else {
            lo = _mm512_and_si512(vb, low), hi = _mm512_and_si512(_mm512_srli_epi16(vb, 4), low);
          }
          for (int m = 0; m < MT; ++m) {
            dot[p][m][2 * u] = _mm512_dpbusd_epi32(dot[p][m][2 * u], lo, _mm512_set1_epi32(act4(x[m], c * kChunk)));
            dot[p][m][2 * u + 1] =
                _mm512_dpbusd_epi32(dot[p][m][2 * u + 1], hi, _mm512_set1_epi32(act4(x[m], c * kChunk + 4)));
          }
        }
      }
    for (int p = 0; p < P; ++p) {
      for (int m = 0; m < MT; ++m)           // exact integers: any order of the partial sums
        for (int i = 1; i < NA; ++i) dot[p][m][0] = _mm512_add_epi32(dot[p][m][0], dot[p][m][i]);
      const __m512 step = _mm512_mul_ps(
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(S[p] + size_t(g) * kRowBlock))), sixteenth);
      for (int m = 0; m < MT; ++m)
        acc[p][m] = _mm512_add_ps(acc[p][m], _mm512_mul_ps(_mm512_cvtepi32_ps(dot[p][m][0]), step));
      if (O[p]) {
        const __m512 o =
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(O[p] + size_t(g) * kRowBlock)));
        for (int m = 0; m < MT; ++m) off[p][m] = _mm512_add_ps(off[p][m], _mm512_mul_ps(o, _mm512_set1_ps(float(xs[m][g]))));
      }
    }
  }
  for (int p = 0; p < P; ++p) {
    const __m512 bias = w.bias ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.bias + nb[p])))
                               : _mm512_setzero_ps();
    for (int m = 0; m < MT; ++m) {
      __m512 v = _mm512_mul_ps(_mm512_add_ps(acc[p][m], off[p][m]), _mm512_set1_ps(a.sx[m0 + m]));
      if (w.bias) v = _mm512_add_ps(v, bias);
      _mm512_storeu_ps(y + size_t(m0 + m) * ldy + nb[p], v);
    }
  }
}

void nested_linear_avx512(const NestedLinear& w, bool target, const QActs& a, float* y, int ldy, int n0, int n1) {
  if (!target && a.M == 1) {   // the draft's one-token pass: blocks i and i + half of the slice's whole blocks in step
    over_block_pairs(w, a, y, ldy, n0, n1, [&](const int* nb, int count) {
      if (count == 2)
        block16<false, 1, 2>(w, a, nb, 0, y, ldy);
      else
        block16<false, 1>(w, a, nb, 0, y, ldy);
    });
    return;
  }
  over_blocks(w, target, a, y, ldy, n0, n1, [&](int nb, int m0, int mt) {
    with_tile(mt, [&](auto MT) {
      if (target)
        block16<true, decltype(MT)::value>(w, a, &nb, m0, y, ldy);
      else
        block16<false, decltype(MT)::value>(w, a, &nb, m0, y, ldy);
    });
  });
}

// float16 weights: two rows at a time, 16 columns of each converted once for every token of the tile (each loaded
// activation serves both rows). A row's sum is the same whichever rows share its tile.
template <int MT, int NR>
void f16_rows(const uint16_t* w, int K, const float* x, int ldx, float* y, int ldy, int n) {
  __m512 acc[NR][MT];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MT; ++m) acc[r][m] = _mm512_setzero_ps();
  int k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r)
      wv[r] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + size_t(n + r) * K + k)));
    for (int m = 0; m < MT; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + size_t(m) * ldx + k);
      for (int r = 0; r < NR; ++r) acc[r][m] = _mm512_fmadd_ps(wv[r], xv, acc[r][m]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MT; ++m) {
      float v = _mm512_reduce_add_ps(acc[r][m]);
      for (int kk = k; kk < K; ++kk) v += _cvtsh_ss(w[size_t(n + r) * K + kk]) * x[size_t(m) * ldx + kk];
      y[size_t(m) * ldy + n + r] = v;
    }
}

void f16_linear_avx512(const uint16_t* w, int K, const float* x, int ldx, int M, float* y, int ldy, int n0, int n1) {
  for (int m0 = 0; m0 < M; m0 += kTokenTile)
    with_tile(std::min(kTokenTile, M - m0), [&](auto MT) {
      constexpr int mt = decltype(MT)::value;
      const float* xm = x + size_t(m0) * ldx;
      float* ym = y + size_t(m0) * ldy;
      int n = n0;
      for (; n + 2 <= n1; n += 2) f16_rows<mt, 2>(w, K, xm, ldx, ym, ldy, n);
      if (n < n1) f16_rows<mt, 1>(w, K, xm, ldx, ym, ldy, n);
    });
}

// zmm lanes for combine_tiles.h: 16 accumulators, with the inputs and a broadcast within 32 registers
struct Zmm {
  using reg = __m512;
  static constexpr int kLanes = 16, kAccumulators = 16;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static reg set1(float v) { return _mm512_set1_ps(v); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
};

// Whole zmm columns, the last n % 16 by the AVX2 set (each value the same roundings).
template <bool FUSED>
void combine16(const float* c, int cb, int ci, int B, int I, const float* in, int ldin, int n, float* out, int ldout) {
  const int j = combine_registers<Zmm, FUSED>(c, cb, ci, B, I, in, ldin, n, out, ldout);
  if (j < n) (FUSED ? avx2::combine_signs : avx2::combine_rows)(c, cb, ci, B, I, in + j, ldin, n - j, out + j, ldout);
}

void combine_rows_avx512(const float* c, int cb, int ci, int B, int I, const float* in, int ldin, int n, float* out,
                         int ldout) {
  combine16<false>(c, cb, ci, B, I, in, ldin, n, out, ldout);
}

void combine_signs_avx512(const float* c, int cb, int ci, int B, int I, const float* in, int ldin, int n, float* out,
                          int ldout) {
  combine16<true>(c, cb, ci, B, I, in, ldin, n, out, ldout);
}

}  // namespace
}  // namespace bitnest

#pragma GCC pop_options

namespace bitnest {    // for any x86-64: runs before anyone knows whether this CPU has AVX-512

const Kernels* avx512_vnni_kernels() {
  if (!cpu_features().avx512_vnni) return nullptr;
  static const Kernels k = [] {
    Kernels t = avx2_table();
    t.name = "avx512-vnni", t.nested_linear = nested_linear_avx512, t.f16_linear = f16_linear_avx512;
    t.combine_rows = combine_rows_avx512, t.combine_signs = combine_signs_avx512;
    return t;
  }();
  return &k;
}

}  // namespace bitnest

#else

namespace bitnest {
const Kernels* avx512_vnni_kernels() { return nullptr; }
}  // namespace bitnest

#endif
