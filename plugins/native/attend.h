// Causal GQA attention over the nested KV cache, written once and instantiated per instruction set with its own
// dot product and axpy: for each query, scores over every visible position (KV4 or KV8 per position), an exact
// two-pass softmax, then the weighted sum of V. The positions are visited in increasing order whatever the number
// of queries in the pass, so each query's result does not depend on it.
#pragma once

#include <algorithm>
#include <cmath>

#include "native.h"

namespace bitnest {

// The planes of one cached position's K (which = 0) or V (which = 1) vector for KV head `hkv`.
inline void kv_entry(const KVLayer& kv, const KVRange& r, int which, int hkv, int pos, const uint8_t** b,
                     const uint8_t** rf, uint16_t* scale) {
  const size_t half = size_t(kv.D) / 2;
  if (!r.draft || pos < r.committed) {
    const size_t row = (size_t(which) * kv.Hkv + hkv) * kv.C + pos;
    *b = kv.base + row * half, *rf = kv.refine + row * half, *scale = kv.scale[row];
  } else {
    const size_t row = (size_t(which) * kv.Hkv + hkv) * kv.S + (pos - r.committed);
    *b = kv.sbase + row * half, *rf = kv.srefine + row * half, *scale = kv.sscale[row];
  }
}

// out [D] = KV4 (q4 s) or KV8 ((16 q4 + qr) s / 16) of one entry; the KV4 read never touches the refinement.
inline void dequant_kv(const uint8_t* b, const uint8_t* rf, float s, int D, bool kv8, float* out) {
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

// Queries in tiles of up to kQueryTile: each cached K and V entry is dequantized once per tile and used by every
// query of the tile that sees it. Each query's scores, softmax and weighted sum are the same operations in the
// same order (positions increasing) as for a query alone, so the result does not depend on the tile.
// scores: [kQueryTile, hpk, positions] floats.
template <class Dot, class Axpy>
inline void attend_with(Dot dot, Axpy axpy, const KVLayer& kv, const KVRange& r, const float* q, int ldq, int hpk,
                        int hkv, int t0, int t1, float* out, int ldo, float* scores) {
  const int D = kv.D;
  const float scale = 1.f / std::sqrt(float(D));
  alignas(32) float vec[512];
  for (int ts = t0; ts < t1; ts += kQueryTile) {
    const int te = std::min(t1, ts + kQueryTile);
    const int n = r.first + te;                           // positions the tile's last query sees
    auto query = [&](int t) { return q + size_t(t) * ldq + size_t(hkv) * hpk * D; };
    auto output = [&](int t) { return out + size_t(t) * ldo + size_t(hkv) * hpk * D; };
    auto row = [&](int t, int j) { return scores + (size_t(t - ts) * hpk + j) * n; };
    for (int pos = 0; pos < n; ++pos) {
      const uint8_t *b, *rf;
      uint16_t sh;
      kv_entry(kv, r, 0, hkv, pos, &b, &rf, &sh);
      dequant_kv(b, rf, f16_to_f32(sh), D, pos >= r.kv8_from, vec);
      for (int t = std::max(ts, pos - r.first); t < te; ++t)    // the queries that see pos
        for (int j = 0; j < hpk; ++j) row(t, j)[pos] = dot(query(t) + size_t(j) * D, vec, D) * scale;
    }
    for (int t = ts; t < te; ++t) {
      const int seen = r.first + t + 1;
      for (int j = 0; j < hpk; ++j) {                     // softmax over the query's visible positions
        float* sc = row(t, j);
        float mx = sc[0];
        for (int pos = 1; pos < seen; ++pos) mx = std::fmax(mx, sc[pos]);
        float sum = 0.f;
        for (int pos = 0; pos < seen; ++pos) sum += (sc[pos] = std::exp(sc[pos] - mx));
        const float inv = 1.f / sum;
        for (int pos = 0; pos < seen; ++pos) sc[pos] *= inv;
        for (int d = 0; d < D; ++d) output(t)[size_t(j) * D + d] = 0.f;
      }
    }
    for (int pos = 0; pos < n; ++pos) {
      const uint8_t *b, *rf;
      uint16_t sh;
      kv_entry(kv, r, 1, hkv, pos, &b, &rf, &sh);
      dequant_kv(b, rf, f16_to_f32(sh), D, pos >= r.kv8_from, vec);
      for (int t = std::max(ts, pos - r.first); t < te; ++t)
        for (int j = 0; j < hpk; ++j) axpy(row(t, j)[pos], vec, output(t) + size_t(j) * D, D);
    }
  }
}

}  // namespace bitnest
