// The row products of combine_rows and combine_signs (native.h) on one register width, shared by the x86 kernel
// sets as linear_tiles.h is: V names the register type and its operations (zero, load, store, broadcast, add, mul,
// fmadd), its lanes and how many accumulators a tile may keep. Every output value gets the portable sequence of
// roundings whatever the width and tiling; FUSED (combine_signs: every coefficient +1 or -1, so each product is
// exact) adds each product by one fused multiply-add, which rounds the same sum. Internal linkage: each translation
// unit compiles its own copy for its instruction set.
#pragma once

#include <cstddef>

namespace bitnest {
namespace {

// Rows [b0, b0 + NB) x columns [j0, j0 + NQ lanes) of the product, the NB x NQ sums in registers for the whole walk
// over i (one load of each input row's columns serves NB output rows).
template <class V, int NB, int NQ, bool FUSED>
inline void combine_tile(const float* c, int cb, int ci, int b0, int I, const float* in, int ldin, int j0, float* out,
                         int ldout) {
  typename V::reg acc[NB][NQ];
  for (int r = 0; r < NB; ++r)
    for (int q = 0; q < NQ; ++q) acc[r][q] = V::zero();
  for (int i = 0; i < I; ++i) {
    const float* x = in + size_t(i) * ldin + j0;
    typename V::reg xv[NQ];
    for (int q = 0; q < NQ; ++q) xv[q] = V::load(x + V::kLanes * q);
    for (int r = 0; r < NB; ++r) {
      const typename V::reg p = V::set1(c[size_t(b0 + r) * cb + size_t(i) * ci]);
      for (int q = 0; q < NQ; ++q) acc[r][q] = FUSED ? V::fmadd(p, xv[q], acc[r][q]) : V::add(acc[r][q], V::mul(p, xv[q]));
    }
  }
  for (int r = 0; r < NB; ++r)
    for (int q = 0; q < NQ; ++q) V::store(out + size_t(b0 + r) * ldout + j0 + V::kLanes * q, acc[r][q]);
}

// Every row over the columns [j, ...) NQ registers at a time while whole ones fit in n; returns where they end.
template <class V, int NQ, bool FUSED>
inline int combine_columns(const float* c, int cb, int ci, int B, int I, const float* in, int ldin, int j, int n,
                           float* out, int ldout) {
  constexpr int NB = V::kAccumulators / NQ, W = NQ * V::kLanes;
  for (; j + W <= n; j += W) {
    int b = 0;
    for (; b + NB <= B; b += NB) combine_tile<V, NB, NQ, FUSED>(c, cb, ci, b, I, in, ldin, j, out, ldout);
    for (; b < B; ++b) combine_tile<V, 1, NQ, FUSED>(c, cb, ci, b, I, in, ldin, j, out, ldout);
  }
  return j;
}

// The columns four registers at a time, then two, then one; returns where whole registers end (the caller computes
// the last n % lanes columns with a narrower set).
template <class V, bool FUSED>
inline int combine_registers(const float* c, int cb, int ci, int B, int I, const float* in, int ldin, int n,
                             float* out, int ldout) {
  int j = combine_columns<V, 4, FUSED>(c, cb, ci, B, I, in, ldin, 0, n, out, ldout);
  j = combine_columns<V, 2, FUSED>(c, cb, ci, B, I, in, ldin, j, n, out, ldout);
  return combine_columns<V, 1, FUSED>(c, cb, ci, B, I, in, ldin, j, n, out, ldout);
}

}  // namespace
}  // namespace bitnest
