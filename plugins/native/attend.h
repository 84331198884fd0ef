// Causal GQA attention over the nested KV cache, written once and compiled into each kernel set's translation
// unit with its own vector pieces (Ops: dequantize one cached entry, dot, axpy, softmax). Everything here has
// internal linkage (an anonymous namespace), so a translation unit built for a wider instruction set never lends
// its copy to another. For each query: scores over every visible position (KV4 or KV8 per position), an exact
// two-pass softmax, then the weighted sum of V. Positions are visited in increasing order whatever the number of
// queries in the pass, so each query's result does not depend on it.
#pragma once

#include <algorithm>
#include <cmath>

#include "native.h"

namespace bitnest {
namespace {

// The planes of one cached position's K (which = 0) or V (which = 1) vector for KV head `hkv`.
inline void kv_entry(const KVLayer& kv, const KVRange& r, int which, int hkv, int pos, const uint8_t** b,
                     const uint8_t** rf, uint16_t* scale) {
  const size_t half = size_t(kv.D) / 2;
  if (r.local.base && pos >= r.first) {
    const size_t row = (size_t(which) * kv.Hkv + hkv) * r.local.M + (pos - r.first);
    *b = r.local.base + row * half, *rf = r.local.refine + row * half, *scale = r.local.scale[row];
  } else if (!r.draft || pos < r.committed) {
    const size_t row = (size_t(which) * kv.Hkv + hkv) * kv.C + pos;
    const size_t ring = (size_t(which) * kv.Hkv + hkv) * kv.ring() + pos % kv.ring();   // the refinement's slot
    *b = kv.base + row * half, *rf = kv.refine + ring * half, *scale = kv.scale[row];
  } else {
    const size_t row = (size_t(which) * kv.Hkv + hkv) * kv.S + (pos - r.committed);
    *b = kv.sbase + row * half, *rf = kv.srefine + row * half, *scale = kv.sscale[row];
  }
}

// out [D] = KV4 (q4 s) or KV8 ((16 q4 + qr) s / 16) of one entry; the KV4 read never touches the refinement.
inline void dequant_kv_portable(const uint8_t* b, const uint8_t* rf, float s, int D, bool kv8, float* out) {
  for (int j = 0; j < D / 2; ++j) {
    const int lo = int8_t(b[j] << 4) >> 4, hi = int8_t(b[j]) >> 4;
    if (kv8) {
      const int rlo = int8_t(rf[j] << 4) >> 4, rhi = int8_t(rf[j]) >> 4;
      out[2 * j] = float(16 * lo + rlo) * (s / 16.f);
      out[2 * j + 1] = float(16 * hi + rhi) * (s / 16.f);
    } else {
      out[2 * j] = float(lo) * s;
      out[2 * j + 1] = float(hi) * s;
    }
  }
}

// sc[0, n) -> softmax(sc) in place: max, exp(sc - max), their sum in index order, times 1 / sum.
inline void softmax_portable(float* sc, int n) {
  float mx = sc[0];
  for (int i = 1; i < n; ++i) mx = std::fmax(mx, sc[i]);
  float sum = 0.f;
  for (int i = 0; i < n; ++i) sum += (sc[i] = std::exp(sc[i] - mx));
  const float inv = 1.f / sum;
  for (int i = 0; i < n; ++i) sc[i] *= inv;
}

// One unit of work (native.h AttendWork): query heads [h0, h1) of KV head hkv for queries [t0, t1), in tiles of up
// to kQueryTile queries. For each block of positions, K is dequantized once and every (query, head) of the tile
// takes its scores from it (Ops::dots: each position's dot in the same order however positions are grouped); an
// exact softmax per (query, head) over the positions it sees; then V block by block, each (query, head)'s output
// accumulated over the block's positions in increasing order (Ops::weighted_sum). A query's result therefore does
// not depend on the other queries of the pass. With an elastic window each query reads KV8 from its own position on
// (KVRange::kv8_from_row): a block is dequantized for the tile's first query, and a later query's positions between
// its first KV8 position and the tile's are read again at KV4 one at a time (their dots, and their place in the
// weighted sum, in position order: the same bits as a tile of one). scores: [kQueryTile, h1 - h0, positions] floats;
// kvbuf: kPosBlock * D floats.
template <class Ops>
void attend_unit(const KVLayer& kv, const KVRange& r, const AttendWork& u, const float* q, int ldq, int hpk,
                 float* out, int ldo, float* scores, float* kvbuf) {
  constexpr int kMaxD = 512;
  const int D = kv.D, nh = u.h1 - u.h0;
  const float scale = 1.f / std::sqrt(float(D));
  float one[kMaxD];                                       // one entry re-read at KV4
  const int tile = r.window && D > kMaxD ? 1 : kQueryTile;
  for (int ts = u.t0; ts < u.t1; ts += tile) {
    const int te = std::min(u.t1, ts + tile), kv8_from = r.kv8_from_row(ts);   // the tile's most-KV8 threshold
    const int n = r.first + te;                           // positions the tile's last query sees
    auto head = [&](int j) { return (size_t(u.hkv) * hpk + u.h0 + j) * D; };
    auto row = [&](int t, int j) { return scores + (size_t(t - ts) * nh + j) * n; };
    auto load_block = [&](int which, int b0, int b1) {
      for (int pos = b0; pos < b1; ++pos) {
        const uint8_t *b, *rf;
        uint16_t sh;
        kv_entry(kv, r, which, u.hkv, pos, &b, &rf, &sh);
        Ops::dequant(b, rf, f16_to_f32(sh), D, pos >= kv8_from, kvbuf + size_t(pos - b0) * D);
      }
    };
    auto load_kv4 = [&](int which, int pos) {
      const uint8_t *b, *rf;
      uint16_t sh;
      kv_entry(kv, r, which, u.hkv, pos, &b, &rf, &sh);
      Ops::dequant(b, rf, f16_to_f32(sh), D, false, one);
    };
    // positions [lo, hi) of block [b0, b0 + seen) that query t reads at KV4 although the block holds them at KV8
    auto kv4_fix = [&](int t, int b0, int seen, int* lo, int* hi) {
      *lo = std::max(b0, kv8_from), *hi = std::min(b0 + seen, r.kv8_from_row(t));
      if (*hi < *lo) *hi = *lo;
    };
    for (int b0 = 0; b0 < n; b0 += kPosBlock) {
      const int b1 = std::min(n, b0 + kPosBlock);
      load_block(0, b0, b1);
      for (int t = std::max(ts, b0 - r.first); t < te; ++t) {       // the queries that see position b0
        const int seen = std::min(b1, r.first + t + 1) - b0;
        int lo, hi;
        kv4_fix(t, b0, seen, &lo, &hi);
        for (int j = 0; j < nh; ++j) {
          float* sc = row(t, j) + b0;
          Ops::dots(q + size_t(t) * ldq + head(j), kvbuf, seen, D, sc);
          for (int pos = lo; pos < hi; ++pos) {
            load_kv4(0, pos);
            Ops::dots(q + size_t(t) * ldq + head(j), one, 1, D, sc + (pos - b0));
          }
          for (int i = 0; i < seen; ++i) sc[i] *= scale;
        }
      }
    }
    for (int t = ts; t < te; ++t)
      for (int j = 0; j < nh; ++j) {
        Ops::softmax(row(t, j), r.first + t + 1);
        std::fill(out + size_t(t) * ldo + head(j), out + size_t(t) * ldo + head(j) + D, 0.f);
      }
    for (int b0 = 0; b0 < n; b0 += kPosBlock) {
      const int b1 = std::min(n, b0 + kPosBlock);
      load_block(1, b0, b1);
      for (int t = std::max(ts, b0 - r.first); t < te; ++t) {
        const int seen = std::min(b1, r.first + t + 1) - b0;
        int lo, hi;
        kv4_fix(t, b0, seen, &lo, &hi);
        for (int j = 0; j < nh; ++j) {
          float* o = out + size_t(t) * ldo + head(j);
          const float* p = row(t, j) + b0;
          if (lo == hi) {
            Ops::weighted_sum(o, p, kvbuf, seen, D);
            continue;
          }
          Ops::weighted_sum(o, p, kvbuf, lo - b0, D);
          for (int pos = lo; pos < hi; ++pos) {
            load_kv4(1, pos);
            Ops::weighted_sum(o, p + (pos - b0), one, 1, D);
          }
          Ops::weighted_sum(o, p + (hi - b0), kvbuf + size_t(hi - b0) * D, b0 + seen - hi, D);
        }
      }
    }
  }
}

// The portable pieces the vector sets replace: one dot per row, in index order; out += p[i] * v[i] for i in order.
inline void dots_portable(const float* q, const float* k, int count, int D, float* out) {
  for (int i = 0; i < count; ++i) {
    float acc = 0.f;
    for (int d = 0; d < D; ++d) acc += q[d] * k[size_t(i) * D + d];
    out[i] = acc;
  }
}

inline void weighted_sum_portable(float* out, const float* p, const float* v, int count, int D) {
  for (int i = 0; i < count; ++i)
    for (int d = 0; d < D; ++d) out[d] += p[i] * v[size_t(i) * D + d];
}

}  // namespace
}  // namespace bitnest
