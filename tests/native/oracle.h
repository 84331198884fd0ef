// The float64 scalar oracle of tests/native/check_kernels.cpp: the contracts (docs/contracts.md; /DESIGN sections 3-6)
// written again as straightforward loops in double over the canonical formats, sharing nothing with the kernels
// (no tiling, no layout, no kernel helper: even float16 is decoded and rounded here by its own code). Quantizers
// return the exact quotients beside the codes so a check can tell a wrong code from a float32 near-tie.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace oracle {

// float16 bits -> value (sign, 5-bit exponent biased 15, 10-bit mantissa; subnormals at 2^-24).
inline double f16(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double v = e ? std::ldexp(1024 + m, e - 25) : std::ldexp(m, -24);
  return h & 0x8000 ? -v : v;
}

// value -> nearest float16 (ties to even), finite |v| < 65520 only.
inline uint16_t to_f16(double v) {
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  v = std::fabs(v);
  int e;
  std::frexp(v, &e);                                      // v = f 2^e, f in [0.5, 1)
  const int lsb = std::max(e - 11, -24);                  // 11 significant bits, or the subnormal step
  const double units = std::nearbyint(std::ldexp(v, -lsb));   // exact: round to nearest even
  const double r = std::ldexp(units, lsb);
  if (r == 0) return sign;
  int re;
  std::frexp(r, &re);
  if (re - 1 < -14) return uint16_t(sign | uint16_t(units));                       // subnormal (or rounded up to 2^-14)
  return uint16_t(sign | uint16_t((re - 1 + 15) << 10) | uint16_t(std::ldexp(r, 11 - re) - 1024));
}

inline double clip(double v, double lo, double hi) { return std::min(std::max(v, lo), hi); }

// A code against its exact quotient: the nearest integer (ties to even) clipped to [lo, hi], or, where the quotient
// lies within `tie` of a half-integer (a float32 quotient there may round either way), either neighbour; with
// `exact_ties`, a quotient exactly on a half-integer is computed exactly by float32 too and must round to even.
inline bool code_ok(int code, double quotient, double lo, double hi, double tie, bool exact_ties = false) {
  if (code == clip(std::nearbyint(quotient), lo, hi)) return true;
  const double frac = quotient - std::floor(quotient);
  if (exact_ties && frac == 0.5) return false;
  return std::fabs(frac - 0.5) < tie &&
         (code == clip(std::floor(quotient), lo, hi) || code == clip(std::ceil(quotient), lo, hi));
}

// Signed nibble i of packed bytes: byte i / 2, low nibble for even i, two's complement.
inline int nibble(const uint8_t* bytes, size_t i) {
  const int v = (bytes[i / 2] >> (4 * (i & 1))) & 15;
  return v >= 8 ? v - 16 : v;
}

// The rounding decisions of a pass, numbered in the order they are made. Where one is within kNearTie of its
// boundary (a half-integer), a float32 computation of the same contract, its input a few 1e-6 code units away, may
// take the other neighbour; such decisions are recorded, and a pass can be rerun with some of them taken the other
// way. Equal |quotients| within one vector (one token's activations, one KV vector) are one decision: float32 rounds
// them alike (token 0's attention output is its own KV8 value, integer codes times s / 16, so its activation quotients
// 127 c / m can sit exactly on a half-integer, for every element of code c at once). Without a Rounding installed,
// rounding is plain round-half-to-even.
constexpr double kNearTie = 1e-4;
struct Rounding {
  long next = 0, vec = 0;                               // decisions so far; vectors so far
  std::vector<long> near, flip;                         // first decisions of near-boundary groups; those to flip
  std::vector<std::pair<long, double>> groups, flipped;  // (vector, |quotient|) of the near groups; of the flipped
};
inline Rounding*& rounding() {
  static Rounding* r = nullptr;
  return r;
}
inline void next_vector() {
  if (rounding()) ++rounding()->vec;
}
inline double round_even(double v) {
  const double r = std::nearbyint(v), other = r == std::floor(v) ? std::ceil(v) : std::floor(v);
  Rounding* R = rounding();
  if (!R) return r;
  const long n = R->next++;
  const std::pair<long, double> key{R->vec, std::fabs(v)};
  auto has = [](const std::vector<std::pair<long, double>>& s, const std::pair<long, double>& k) {
    return std::find(s.begin(), s.end(), k) != s.end();
  };
  if (std::fabs(v - std::floor(v) - 0.5) < kNearTie && !has(R->groups, key)) R->groups.push_back(key), R->near.push_back(n);
  if (std::find(R->flip.begin(), R->flip.end(), n) != R->flip.end()) R->flipped.push_back(key);
  return has(R->flipped, key) ? other : r;
}

// Per-token symmetric INT8 activations: s = max(max|x| / 127, 1e-12), q = clip(round_half_even(x / s), -127, 127).
struct Acts {
  std::vector<int> q;            // [M, K]
  std::vector<double> s, quot;   // [M]; the exact quotients x / s [M, K]
  int M = 0, K = 0;
};
inline Acts quantize_acts(const std::vector<double>& x, int M, int K) {
  Acts a{std::vector<int>(size_t(M) * K), std::vector<double>(M), std::vector<double>(size_t(M) * K), M, K};
  for (int m = 0; m < M; ++m) {
    next_vector();
    double amax = 0;
    for (int k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[size_t(m) * K + k]));
    a.s[m] = std::max(amax / 127, 1e-12);
    for (int k = 0; k < K; ++k) {
      const size_t i = size_t(m) * K + k;
      a.quot[i] = x[i] / a.s[m];
      a.q[i] = int(clip(round_even(a.quot[i]), -127, 127));
    }
  }
  return a;
}

// One canonical nested linear: W [N, K], group G; signed nibbles row-major, column 2j low, 2j+1 high (two's
// complement); float16 scale (and offset) [N, K/G], bias [N] or empty.
struct Planes {
  const uint8_t *base, *refine;
  const uint16_t *scale, *offset, *bias;   // offset, bias: null where absent
  int N, K, G;
  int code(const uint8_t* p, int n, int k) const { return nibble(p, size_t(n) * K + k); }
  // W_draft = q4 s (+ offset), W_target = (16 q4 + qr) s / 16 (+ offset)
  double weight(int n, int k, bool target) const {
    const size_t g = size_t(n) * (K / G) + k / G;
    const double s = f16(scale[g]), q4 = code(base, n, k);
    const double w = target ? (16 * q4 + code(refine, n, k)) * s / 16 : q4 * s;
    return w + (offset ? f16(offset[g]) : 0.0);
  }
};

// y [M, N] = s_x (xq . W_view[n]) + bias: the weights dequantized in double, one dot per (m, n).
inline std::vector<double> linear(const Planes& w, bool target, const std::vector<int>& q, const std::vector<double>& s,
                                  int M) {
  std::vector<double> y(size_t(M) * w.N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < w.N; ++n) {
      double acc = 0;
      for (int k = 0; k < w.K; ++k) acc += q[size_t(m) * w.K + k] * w.weight(n, k, target);
      y[size_t(m) * w.N + n] = acc * s[m] + (w.bias ? f16(w.bias[n]) : 0.0);
    }
  return y;
}
inline std::vector<double> linear(const Planes& w, bool target, const std::vector<double>& x, int M) {
  const Acts a = quantize_acts(x, M, w.K);
  return linear(w, target, a.q, a.s, M);
}

// Nested KV quantization of one vector: s = max(max|x| / 7, 2^-24) rounded to float16 and used rounded,
// q4 = clip(round(x / s), -8, 7), qr = clip(round((x - q4 s) / (s / 16)), -8, 7).
struct KV {
  uint16_t scale;
  std::vector<int> q4, qr;
};
inline KV quantize_kv(const double* x, int D) {
  next_vector();
  double amax = 0;
  for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(x[d]));
  const double q = std::max(amax / 7, std::ldexp(1.0, -24));
  int e;
  std::frexp(q, &e);
  const int lsb = std::max(e - 11, -24);                          // the float16 grid at q
  KV r{to_f16(std::ldexp(round_even(std::ldexp(q, -lsb)), lsb)), std::vector<int>(D), std::vector<int>(D)};
  const double s = f16(r.scale);
  for (int d = 0; d < D; ++d) {
    r.q4[d] = int(clip(round_even(x[d] / s), -8, 7));
    r.qr[d] = int(clip(round_even((x[d] - r.q4[d] * s) / (s / 16)), -8, 7));
  }
  return r;
}
inline double kv_value(const KV& e, int d, bool kv8) {
  const double s = f16(e.scale);
  return kv8 ? (16.0 * e.q4[d] + e.qr[d]) * s / 16 : e.q4[d] * s;
}

inline std::vector<double> rms_norm(const double* x, const uint16_t* w, int n, double eps) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1 / std::sqrt(ss / n + eps);
  std::vector<double> out(n);
  for (int i = 0; i < n; ++i) out[i] = x[i] * inv * f16(w[i]);
  return out;
}

inline double silu(double z) { return z / (1 + std::exp(-z)); }

// x [pre, f, post] @ (H_f / sqrt(f)) along the middle axis, H_f[i][j] = (-1)^popcount(i & j): the matrix product.
inline std::vector<double> hadamard(const std::vector<float>& x, int pre, int f, int post) {
  std::vector<double> out(x.size());
  for (int p = 0; p < pre; ++p)
    for (int j = 0; j < f; ++j)
      for (int q = 0; q < post; ++q) {
        double acc = 0;
        for (int i = 0; i < f; ++i)
          acc += (__builtin_popcount(unsigned(i & j)) % 2 ? -1.0 : 1.0) * x[(size_t(p) * f + i) * post + q];
        out[(size_t(p) * f + j) * post + q] = acc / std::sqrt(double(f));
      }
  return out;
}

// Rotate-half RoPE (HF Llama) of one head vector at a position: x cos + rotate_half(x) sin.
inline void rope(double* x, const float* cos, const float* sin, int D) {
  std::vector<double> t(x, x + D);
  for (int d = 0; d < D; ++d) x[d] = t[d] * cos[d] + (d < D / 2 ? -t[d + D / 2] : t[d - D / 2]) * sin[d];
}

// Causal GQA attention of T queries at positions first .. first + T - 1 over values `value(t, which, h, pos, d)` as
// query t reads them (which: 0 = K, 1 = V; per query, as elastic KV's window reads): softmax(q . k / sqrt(D)) . v, in
// double, one query head at a time.
template <class Value>
std::vector<double> attention_rows(const std::vector<double>& q, int T, int first, int Hq, int Hkv, int D, Value value) {
  std::vector<double> out(size_t(T) * Hq * D);
  const int hpk = Hq / Hkv;
  for (int t = 0; t < T; ++t)
    for (int hq = 0; hq < Hq; ++hq) {
      const int h = hq / hpk, n = first + t + 1;
      std::vector<double> p(n);
      double mx = -1e300, sum = 0;
      for (int pos = 0; pos < n; ++pos) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += q[(size_t(t) * Hq + hq) * D + d] * value(t, 0, h, pos, d);
        p[pos] = dot / std::sqrt(double(D)), mx = std::max(mx, p[pos]);
      }
      for (auto& v : p) sum += (v = std::exp(v - mx));
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int pos = 0; pos < n; ++pos) o += p[pos] / sum * value(t, 1, h, pos, d);
        out[(size_t(t) * Hq + hq) * D + d] = o;
      }
    }
  return out;
}

// The same where every query reads the same values `value(which, h, pos, d)`.
template <class Value>
std::vector<double> attention(const std::vector<double>& q, int T, int first, int Hq, int Hkv, int D, Value value) {
  return attention_rows(q, T, first, Hq, Hkv, D,
                        [&](int, int which, int h, int pos, int d) { return value(which, h, pos, d); });
}

}  // namespace oracle
