// The interleaved plane layout of native.h (rows in blocks of kRowBlock, 4 bytes a row per chunk of 8 columns),
// made in place from the canonical one at load, and the portable nested linear that reads it: the semantics every
// kernel set reproduces bit for bit.
#include <algorithm>
#include <vector>

#include "native.h"

namespace bitnest {

void interleave_plane(uint8_t* plane, int N, int K) {
  const size_t rb = size_t(K) / 2;
  std::vector<uint8_t> rows(size_t(kRowBlock) * rb);
  for (int n0 = 0; n0 < N; n0 += kRowBlock) {
    const int R = std::min(kRowBlock, N - n0);
    uint8_t* block = plane + size_t(n0) * rb;
    std::copy(block, block + size_t(R) * rb, rows.data());
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = rows.data() + size_t(r) * rb;
      auto nib = [&](int col) { return (row[col / 2] >> (4 * (col & 1))) & 0xF; };
      for (int c = 0; c < K / kChunk; ++c)
        for (int j = 0; j < 4; ++j)
          block[size_t(c) * 4 * R + 4 * r + j] = uint8_t(nib(c * kChunk + j) | nib(c * kChunk + 4 + j) << 4);
    }
  }
}

void interleave_groups(uint16_t* values, int N, int ng) {
  std::vector<uint16_t> rows(size_t(kRowBlock) * ng);
  for (int n0 = 0; n0 < N; n0 += kRowBlock) {
    const int R = std::min(kRowBlock, N - n0);
    uint16_t* block = values + size_t(n0) * ng;
    std::copy(block, block + size_t(R) * ng, rows.data());
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < ng; ++g) block[size_t(g) * R + r] = rows[size_t(r) * ng + g];
  }
}

void plane_position(int N, int K, int n, int k, size_t* byte, int* shift) {
  const int n0 = n - n % kRowBlock, R = std::min(kRowBlock, N - n0), c = k / kChunk, j = k % kChunk;
  *byte = size_t(n0) * (K / 2) + size_t(c) * 4 * R + 4 * (n - n0) + (j & 3);
  *shift = j < 4 ? 0 : 4;
}

size_t group_index(int N, int ng, int n, int g) {
  const int n0 = n - n % kRowBlock, R = std::min(kRowBlock, N - n0);
  return size_t(n0) * ng + size_t(g) * R + (n - n0);
}

// One row n for token m: the exact integer of each group (draft: nibble . x - 8 sum(x); target: byte . x - 136 sum(x),
// byte = 16 base + refine), then acc += float(exact) * step per group in order, (acc + offset part) * s_x + bias.
// Built with -ffp-contract=off: every product and sum is rounded on its own, as in the vector kernels.
float nested_linear_row(const NestedLinear& w, bool target, const QActs& a, int m, int n) {
  const int K = w.K, ng = K / w.G, cpg = w.G / kChunk;
  const int corr = target ? 136 : 8;
  const int b0 = n - n % kRowBlock, R = std::min(kRowBlock, w.N - b0), r = n - b0;
  const uint8_t* B = w.base + size_t(b0) * (K / 2) + 4 * r;
  const uint8_t* F = target ? w.refine + size_t(b0) * (K / 2) + 4 * r : nullptr;
  const int8_t* x = a.xq + size_t(m) * K;
  const int32_t* xs = a.xsum + size_t(m) * ng;
  float acc = 0.f, off = 0.f;
  for (int g = 0; g < ng; ++g) {
    int32_t exact = -corr * xs[g];
    for (int c = g * cpg; c < (g + 1) * cpg; ++c) {
      const uint8_t* bb = B + size_t(c) * 4 * R;
      const int8_t* xc = x + c * kChunk;
      for (int j = 0; j < 4; ++j) {
        int lo = bb[j] & 0xF, hi = bb[j] >> 4;
        if (target) lo = 16 * lo + (F[size_t(c) * 4 * R + j] & 0xF), hi = 16 * hi + (F[size_t(c) * 4 * R + j] >> 4);
        exact += lo * xc[j] + hi * xc[j + 4];
      }
    }
    const size_t gi = size_t(b0) * ng + size_t(g) * R + r;
    const float step = f16_to_f32(w.scale[gi]) * (target ? 1.f / 16.f : 1.f);
    acc += float(exact) * step;
    if (w.offset) off += f16_to_f32(w.offset[gi]) * float(xs[g]);
  }
  float v = (acc + off) * a.sx[m];
  if (w.bias) v += f16_to_f32(w.bias[n]);
  return v;
}

void nested_linear_rows(const NestedLinear& w, bool target, const QActs& a, float* y, int ldy, int n0, int n1) {
  for (int n = n0; n < n1; ++n)
    for (int m = 0; m < a.M; ++m) y[size_t(m) * ldy + n] = nested_linear_row(w, target, a, m, n);
}

}  // namespace bitnest
