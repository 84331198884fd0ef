// The nested linear's walk over the interleaved layout (native.h), shared by the vector kernel sets: whole row
// blocks go to the set's block kernel, token tiles of up to kTokenTile tokens each (every weight chunk is loaded
// once per tile: once per pass for a decode pass), and rows outside whole blocks (a slice edge that is not block
// aligned, the last partial block) to the portable row kernel, which computes the same bits. Internal linkage: each
// translation unit compiles its own copy for its instruction set.
#pragma once

#include <algorithm>
#include <type_traits>

#include "native.h"

namespace bitnest {
namespace {

// block(nb, m0, mt) for every whole block [nb, nb + kRowBlock) inside [n0, n1) and every token tile [m0, m0 + mt).
template <class Block>
inline void over_blocks(const NestedLinear& w, bool target, const QActs& a, float* y, int ldy, int n0, int n1,
                        Block block) {
  const int whole_end = std::min(n1, w.N - w.N % kRowBlock);
  int nb = std::min(n1, (n0 + kRowBlock - 1) / kRowBlock * kRowBlock);
  if (n0 < nb) nested_linear_rows(w, target, a, y, ldy, n0, nb);
  for (; nb + kRowBlock <= whole_end; nb += kRowBlock)
    for (int m0 = 0; m0 < a.M; m0 += kTokenTile) block(nb, m0, std::min(kTokenTile, a.M - m0));
  if (nb < n1) nested_linear_rows(w, target, a, y, ldy, nb, n1);
}

// For a one-token pass: block(nb, count) with nb[0] = block i and nb[1] = block i + half of the whole blocks inside
// [n0, n1) (count 2), the odd one last (count 1), and rows outside whole blocks to the portable row kernel.
template <class Block>
inline void over_block_pairs(const NestedLinear& w, const QActs& a, float* y, int ldy, int n0, int n1, Block block) {
  const int whole_end = std::min(n1, w.N - w.N % kRowBlock);
  const int first = std::min(n1, (n0 + kRowBlock - 1) / kRowBlock * kRowBlock);
  if (n0 < first) nested_linear_rows(w, false, a, y, ldy, n0, first);
  const int blocks = std::max(0, (whole_end - first) / kRowBlock), half = blocks / 2;
  for (int i = 0; i < half; ++i) {
    const int nb[2] = {first + i * kRowBlock, first + (i + half) * kRowBlock};
    block(nb, 2);
  }
  if (blocks % 2) {
    const int nb[1] = {first + (blocks - 1) * kRowBlock};
    block(nb, 1);
  }
  const int end = first + blocks * kRowBlock;
  if (end < n1) nested_linear_rows(w, false, a, y, ldy, end, n1);
}

// fn(std::integral_constant<int, MT>{}) with MT the compile-time token count of a tile (1 .. kTokenTile).
template <class Fn>
inline void with_tile(int mt, Fn&& fn) {
  switch (mt) {
    case 1: fn(std::integral_constant<int, 1>{}); break;
    case 2: fn(std::integral_constant<int, 2>{}); break;
    case 3: fn(std::integral_constant<int, 3>{}); break;
    case 4: fn(std::integral_constant<int, 4>{}); break;
    case 5: fn(std::integral_constant<int, 5>{}); break;
    case 6: fn(std::integral_constant<int, 6>{}); break;
    case 7: fn(std::integral_constant<int, 7>{}); break;
    default: fn(std::integral_constant<int, 8>{}); break;
  }
}

// Bytes ahead of the chunk being read that each plane stream prefetches (into the next block past a block's end):
// with one or two sequential streams a thread, the hardware prefetcher alone left a single-thread draft pass at
// ~22 GB/s; prefetching 4 KiB ahead gave 10-20% on the passes of the default model (measured on this AMD machine).
constexpr int kPrefetch = 4096;

inline void prefetch(const uint8_t* p) { __builtin_prefetch(p + kPrefetch, 0, 3); }

// The dword of 4 INT8 activations at column k (a broadcast operand).
inline int32_t act4(const int8_t* x, int k) {
  int32_t v;
  __builtin_memcpy(&v, x + k, 4);
  return v;
}

}  // namespace
}  // namespace bitnest
