// The nested linear on 8 int32 lanes (ymm: AVX2, AVX-VNNI), included by each such kernel translation unit after
// its `#pragma GCC target` with a dot-product policy P of its own (internal linkage). A 16-row block is two halves
// of 8 rows: bytes [32 h, 32 h + 32) of every 64-byte chunk. For each half and token tile of up to 8 tokens, one
// int32 accumulator per token holds the exact group sum of 8 rows; every weight chunk is loaded and unpacked once
// for all tokens of the tile. P supplies:
//   W                  the unpacked weights of one half chunk (8 rows x 8 columns)
//   load(b, r)         W from 32 base (and refinement) plane bytes
//   dot(acc, w, xl, xh) acc + the products of w with the broadcast activation dwords of columns 8c..8c+3, +4..+7
//   kCorr              the offset to take off, times the group sum of x (8, 136, or 0 for signed codes)
//   kTarget            whether W reads the refinement plane
#pragma once

#include "linear_tiles.h"

namespace bitnest {
namespace {

template <class P, int MT>
void half_block(const NestedLinear& w, const QActs& a, int nb, int half, int m0, float* y, int ldy) {
  const int K = w.K, ng = K / w.G, cpg = w.G / kChunk;
  const uint8_t* B = w.base + size_t(nb) * (K / 2) + 32 * half;
  const uint8_t* F = P::kTarget ? w.refine + size_t(nb) * (K / 2) + 32 * half : nullptr;
  const uint16_t* S = w.scale + size_t(nb) * ng + 8 * half;
  const uint16_t* O = w.offset ? w.offset + size_t(nb) * ng + 8 * half : nullptr;
  const __m256 sixteenth = _mm256_set1_ps(P::kTarget ? 1.f / 16.f : 1.f);
  const int8_t* x[MT];
  const int32_t* xs[MT];
  __m256 acc[MT], off[MT];
  for (int m = 0; m < MT; ++m) {
    x[m] = a.xq + size_t(m0 + m) * K, xs[m] = a.xsum + size_t(m0 + m) * ng;
    acc[m] = _mm256_setzero_ps(), off[m] = _mm256_setzero_ps();
  }
  for (int g = 0; g < ng; ++g) {
    __m256i dot[MT];
    for (int m = 0; m < MT; ++m) dot[m] = _mm256_set1_epi32(-P::kCorr * xs[m][g]);
    for (int c = g * cpg; c < (g + 1) * cpg; ++c) {
      if (half == 0) {                     // the second half reads the same lines from the cache
        prefetch(B + size_t(c) * 64);
        if (P::kTarget) prefetch(F + size_t(c) * 64);
      }
      const typename P::W wv = P::load(B + size_t(c) * 64, P::kTarget ? F + size_t(c) * 64 : nullptr);
      for (int m = 0; m < MT; ++m)
        dot[m] = P::dot(dot[m], wv, _mm256_set1_epi32(act4(x[m], c * kChunk)),
                        _mm256_set1_epi32(act4(x[m], c * kChunk + 4)));
    }
    // acc += float(exact) * step, one rounding each, in group order (nested_linear_rows)
    const __m256 step = _mm256_mul_ps(
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(S + size_t(g) * kRowBlock))), sixteenth);
    for (int m = 0; m < MT; ++m) acc[m] = _mm256_add_ps(acc[m], _mm256_mul_ps(_mm256_cvtepi32_ps(dot[m]), step));
    if (O) {
      const __m256 o = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(O + size_t(g) * kRowBlock)));
      for (int m = 0; m < MT; ++m) off[m] = _mm256_add_ps(off[m], _mm256_mul_ps(o, _mm256_set1_ps(float(xs[m][g]))));
    }
  }
  const __m256 bias = w.bias ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.bias + nb + 8 * half)))
                             : _mm256_setzero_ps();
  for (int m = 0; m < MT; ++m) {
    __m256 v = _mm256_mul_ps(_mm256_add_ps(acc[m], off[m]), _mm256_set1_ps(a.sx[m0 + m]));
    if (w.bias) v = _mm256_add_ps(v, bias);
    _mm256_storeu_ps(y + size_t(m0 + m) * ldy + nb + 8 * half, v);
  }
}

// Rows [n0, n1) of the view through policy P (the draft's or the target's).
template <class P>
void linear_ymm(const NestedLinear& w, bool target, const QActs& a, float* y, int ldy, int n0, int n1) {
  over_blocks(w, target, a, y, ldy, n0, n1, [&](int nb, int m0, int mt) {
    with_tile(mt, [&](auto MT) {
      half_block<P, decltype(MT)::value>(w, a, nb, 0, m0, y, ldy);
      half_block<P, decltype(MT)::value>(w, a, nb, 1, m0, y, ldy);
    });
  });
}

}  // namespace
}  // namespace bitnest
