// Standalone check of the native kernels of one instruction set, without torch: built by tests/test_native_cross.py
// and run natively for every kernel set this CPU runs, the portable one included, and for aarch64 under qemu (the
// Jetson's NEON paths, with and without sdot, and the portable kernels). Exit 0 when every check holds; one line per
// failure otherwise, and one line of the worst errors measured against the oracle.
//
//   check_kernels ISA      (ISA: a name of isa_names(), or "" for the best here)
//
// Every kernel of the set named, the portable set too, is checked against the float64 scalar oracle (oracle.h: the
// contracts as plain loops in double over the canonical formats, independent of the kernels' layout, tiling and
// helpers): the nested linear (draft and target views, offsets, biases, every group size); the INT8 activation
// quantizer (codes, scales, group sums; exact ties to even); the KV quantizer (float16 scale, KV4 and refinement
// codes; exact ties to even); SiLU * up, RMSNorm, the Hadamard butterflies, combine_rows and dot; attention over KV8, KV4
// and Recent-N; and the whole step (check_step.cpp). Bounds are derived beside each check. Besides: the interleaved
// layout holds the canonical planes; the nested linear's rows are bit for bit the portable kernel's, whatever M and
// whatever slice of rows; the per-token kernels equal the portable ones bit for bit where the contract says so;
// attention per query equals the whole pass's; a failing pool worker neither deadlocks nor poisons the next job.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "check.h"
#include "pool.h"

using namespace bitnest;
using namespace check;

static double worst_linear = 0, worst_attention = 0;

static void check_layout(std::mt19937& rng) {
  for (int n : {16, 45, 3}) {
    const Linear l = random_linear(rng, n, 192, 64, false, true);
    bool ok = true;
    for (int r = 0; r < n; ++r)
      for (int k = 0; k < 192; ++k) {
        size_t byte;
        int shift;
        plane_position(n, 192, r, k, &byte, &shift);
        ok &= (((l.lbase[byte] >> shift) & 15) ^ 8) == ((l.code4(r, k) & 15));
        if (k % 64 == 0) ok &= l.lscale[group_index(n, 3, r, k / 64)] == l.scale[size_t(r) * 3 + k / 64];
      }
    expect(ok, "interleaved layout holds the canonical codes and scales", n);
  }
}

// The nested linear on the oracle's INT8 codes (the quantizer is checked on its own in check_tokens) against
// oracle::linear. The kernels' integer group sums are exact; what rounds is float32: one product per group (its
// sum times its scale), the sum over ng <= 12 groups in group order, the offset term, the product with s_x, the bias:
// <= (ng + 3) 2^-24 of the sum of the terms' magnitudes, 1e-6 with the cancellation random rows show (measured:
// the worst relative error is printed).
static void check_linear(const Kernels& k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  struct Shape { int n, K, g; bool sym, off, bias; };
  for (const Shape& s : {Shape{45, 768, 64, false, false, false}, Shape{45, 768, 64, true, false, true},
                         Shape{64, 768, 128, true, false, false}, Shape{48, 768, 256, false, true, false},
                         Shape{32, 576, 192, true, false, true}, Shape{50, 576, 64, true, true, true}}) {
    const Linear l = random_linear(rng, s.n, s.K, s.g, s.sym, s.off, s.bias);
    const NestedLinear w = l.view();
    expect(l.int8 == (s.sym && !s.off), "int8 target detected");
    for (int M : {1, 3, 5, 8, 9, 13}) {
      std::vector<double> x(size_t(M) * s.K);
      for (auto& v : x) v = nd(rng);
      const oracle::Acts oa = oracle::quantize_acts(x, M, s.K);
      std::vector<int8_t> xq(oa.q.begin(), oa.q.end());
      std::vector<int32_t> xs(size_t(M) * s.K / s.g, 0);
      std::vector<float> sx(oa.s.begin(), oa.s.end());
      std::vector<double> sxd(sx.begin(), sx.end());          // the float32 scale the kernels get
      for (size_t i = 0; i < xq.size(); ++i) xs[i / s.g] += xq[i];
      const QActs a{xq.data(), xs.data(), sx.data(), M, s.K, s.g};
      for (bool target : {false, true}) {
        std::vector<float> want(size_t(M) * s.n), got(want.size()), rows(want.size()), sliced(want.size());
        generic_kernels().nested_linear(w, target, a, want.data(), s.n, 0, s.n);
        k.nested_linear(w, target, a, got.data(), s.n, 0, s.n);
        const double err = rel(got, oracle::linear(l.planes(), target, oa.q, sxd, M));
        worst_linear = std::max(worst_linear, err);
        expect(err < 1e-6, target ? "target nested_linear vs float64 oracle" : "draft nested_linear vs float64 oracle", err);
        expect(same_bits(got, want), target ? "target rows bit for bit the portable ones" : "draft rows bit for bit the portable ones",
               rel(got, want));
        for (int m = 0; m < M; ++m) {         // one token at a time: bit for bit the same rows
          const QActs one{xq.data() + size_t(m) * s.K, xs.data() + size_t(m) * (s.K / s.g), sx.data() + m, 1, s.K, s.g};
          k.nested_linear(w, target, one, rows.data() + size_t(m) * s.n, s.n, 0, s.n);
        }
        expect(same_bits(rows, got), "rows independent of M");
        for (int a0 : {0, 5, 16, 17}) {       // any slice: block-aligned or not
          const int a1 = std::min(s.n, a0 + 21);
          k.nested_linear(w, target, a, sliced.data(), s.n, a0, a1);
          bool ok = true;
          for (int m = 0; m < M; ++m)
            ok &= std::memcmp(&sliced[size_t(m) * s.n + a0], &got[size_t(m) * s.n + a0], size_t(a1 - a0) * 4) == 0;
          expect(ok, "a slice of rows equals the whole pass's", a0);
        }
      }
    }
  }
}

// The INT8 activation quantizer against the oracle's exact codes. float32 computes s = fl(max|x| / 127) (one
// rounding: within 2^-24 = 6e-8 of the oracle's) and fl(x / s) (one more): |fl(x / s) - x / s_exact| < 127 * 3 * 2^-24
// < 2.5e-5, so a code may leave the exact rounding only within 2.5e-5 of a half-integer. Token 3 has max|x| = 127:
// s = 1 and x / s exact in float32 too, and its half-integers must round to even.
static void check_quantize(const Kernels& k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 3.f);
  const int M = 4, K = 1536, G = 128;
  std::vector<float> x(size_t(M) * K);
  for (auto& v : x) v = nd(rng);
  float* ties = &x[size_t(3) * K];
  for (int i = 0; i < K; ++i) ties[i] = std::fmin(std::fmax(std::trunc(ties[i] * 10), -126.f), 126.f) + (i % 3 ? 0.5f : 0.f);
  ties[5] = 127.f;
  std::vector<int8_t> xq(x.size()), pq(x.size());
  std::vector<int32_t> xs(size_t(M) * K / G), ps(xs.size());
  std::vector<float> sx(M), psx(M);
  k.quantize(x.data(), K, M, K, G, xq.data(), xs.data(), sx.data());
  quantize_acts(x.data(), K, M, K, G, pq.data(), ps.data(), psx.data());
  expect(xq == pq && xs == ps && sx == psx, "quantize equals the portable codes bit for bit");
  const oracle::Acts oa = oracle::quantize_acts(std::vector<double>(x.begin(), x.end()), M, K);
  bool codes = true, sums = true, scales = true;
  for (int m = 0; m < M; ++m) {
    scales &= std::fabs(sx[m] - oa.s[m]) <= oa.s[m] * 6e-8;
    for (int i = 0; i < K; ++i) {
      const size_t at = size_t(m) * K + i;
      codes &= oracle::code_ok(xq[at], oa.quot[at], -127, 127, m == 3 ? 0 : 2.5e-5, m == 3);
    }
    for (int g = 0; g < K / G; ++g) {
      int sum = 0;
      for (int i = g * G; i < (g + 1) * G; ++i) sum += xq[size_t(m) * K + i];
      sums &= xs[size_t(m) * (K / G) + g] == sum;
    }
  }
  expect(scales, "quantize: s = max|x| / 127 (float32 of the exact quotient)");
  expect(codes, "quantize: codes = round half to even of x / s, clipped to [-127, 127]");
  expect(sums, "quantize: group sums of the codes");
}

// The KV quantizer against the oracle. The scale is float16 of max|x| / 7, the float32 quotient rounded first (2^-24),
// so near a float16 midpoint either neighbour. With s float16 (exact in float32), fl(x / s) is one rounding,
// < 8 * 2^-24 < 1e-6 from exact, and x - q4 s is exact in float32 (|x - q4 s| <= s, both on s's grid), so
// fl((x - q4 s) / (s / 16)) is one rounding too: codes leave the exact rounding only within 1e-6 of a half-integer;
// exact half-integers are exact in float32 as well and round to even (vector 1: s = 1, ties 7 / 2 and -3.5).
static void check_quantize_kv(const Kernels& k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 6.f);
  const int D = 64, n = 9;
  std::vector<float> kvx(size_t(n) * D);
  for (auto& v : kvx) v = nd(rng);
  for (int i = 0; i < D; ++i) kvx[i] = 0.f;                   // an all-zero vector takes the smallest scale, 2^-24
  for (int i = 0; i < D; ++i) kvx[D + i] = float(int(kvx[D + i]) % 7) * 0.5f;   // s = 1: exact ties of x / s and of
  kvx[D + 5] = 7.f, kvx[D + 6] = -3.5f, kvx[D + 7] = 0.03125f;                   // the residual (0.5 / (1 / 16) = 8)
  for (int i = 0; i < D; ++i) kvx[size_t(8) * D + i] *= 1e-6f;                   // a float16 subnormal scale
  bool same = true, scale_ok = true, codes = true;
  for (int v = 0; v < n; ++v) {
    const float* x = &kvx[size_t(v) * D];
    uint8_t b1[32], r1[32], b2[32], r2[32];
    uint16_t s1, s2;
    quantize_kv_vector(x, D, b1, r1, &s1);
    k.quantize_kv(x, D, b2, r2, &s2);
    same &= s1 == s2 && !std::memcmp(b1, b2, 32) && !std::memcmp(r1, r2, 32);
    double amax = 0;
    for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(double(x[d])));
    const double q = std::max(amax / 7, std::ldexp(1.0, -24)), e = std::ldexp(1.0, -23);
    scale_ok &= s2 == oracle::to_f16(q) || s2 == oracle::to_f16(q * (1 + e)) || s2 == oracle::to_f16(q * (1 - e));
    const double s = oracle::f16(s2);
    for (int d = 0; d < D; ++d) {
      const int q4 = oracle::nibble(b2, d), qr = oracle::nibble(r2, d);
      codes &= oracle::code_ok(q4, x[d] / s, -8, 7, 1e-6, true) &&
               oracle::code_ok(qr, (x[d] - q4 * s) / (s / 16), -8, 7, 1e-6, true);
    }
  }
  expect(scale_ok, "quantize_kv: scale = float16 of max|x| / 7");
  expect(codes, "quantize_kv: q4 and refinement codes of the contract");
  expect(same, "quantize_kv bit for bit the portable KV write");
}

// The per-token float kernels against double.
static void check_tokens(const Kernels& k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 3.f);
  const int K = 1536;
  std::vector<float> g(K), u(K), want, got;
  std::vector<double> ref(K);
  for (int i = 0; i < K; ++i) g[i] = nd(rng) * 4, u[i] = nd(rng);
  want = got = g;
  silu_mul_portable(want.data(), u.data(), K);
  k.silu_mul(got.data(), u.data(), K);
  for (int i = 0; i < K; ++i) ref[i] = oracle::silu(g[i]) * u[i];
  // exp within 2 ulp of libm's (itself < 1 ulp), then an add, a division and a product: < 6 * 2^-24 a value
  expect(rel(got, ref) < 1e-6, "silu_mul vs float64", rel(got, ref));
  expect(rel(want, ref) < 1e-6, "portable silu_mul vs float64", rel(want, ref));
  std::vector<uint16_t> w(K);
  for (auto& v : w) v = f32_to_f16(nd(rng));
  got.assign(K, 0);
  k.rms_norm(g.data(), w.data(), K, 1e-5f, got.data());
  const std::vector<double> gd(g.begin(), g.end()), nref = oracle::rms_norm(gd.data(), w.data(), K, double(1e-5f));
  // a float32 sum of K positive squares, in any order, is within (K - 1) 2^-24 = 9.2e-5 of the exact sum; the
  // inverse square root halves that, and four roundings a value add 2.4e-7: 5e-5 bounds every summation order
  expect(rel(got, nref) < 5e-5, "rms_norm vs float64", rel(got, nref));
  for (auto [pre, f, post] : {std::array<int, 3>{12, 128, 1}, std::array<int, 3>{1, 64, 24}, std::array<int, 3>{3, 4, 128},
                              std::array<int, 3>{2, 32, 3}}) {
    want = got = std::vector<float>(g.begin(), g.begin() + pre * f * post);
    const std::vector<double> href = oracle::hadamard(want, pre, f, post);
    fwht_portable(want.data(), pre, f, post);
    k.fwht(got.data(), pre, f, post);
    expect(same_bits(got, want), "fwht bit for bit the portable butterflies", f);
    // each of the log2 f butterfly stages is sqrt(2) times an orthogonal map and rounds every value once, the final
    // 1 / sqrt(f) once more: ||error|| <= (log2 f + 1) 2^-24 ||x||, 4.8e-7 for f = 128
    expect(rel(got, href) < 1e-6, "fwht vs the float64 Hadamard product", rel(got, href));
  }
  // combine_rows: Paley-factor shapes (coefficients F[i, b], strides 1 and f) and token rows x rotation (strides I
  // and 1), column counts that take every tile (64, 32, 16 or 8 columns and the portable tail) and odd row counts
  for (auto [B, I, n, by_column] : {std::array<int, 4>{12, 12, 4, 1}, std::array<int, 4>{28, 28, 32, 1},
                                    std::array<int, 4>{19, 19, 45, 1}, std::array<int, 4>{7, 7, 27, 1},
                                    std::array<int, 4>{5, 64, 77, 0},
                                    std::array<int, 4>{1, 40, 8, 0}}) {
    const int cb = by_column ? 1 : I, ci = by_column ? B : 1, ldin = n + 3, ldout = n + 5;
    std::vector<float> c(size_t(B) * I), in(size_t(I) * ldin), cw(size_t(B) * ldout, 7.f), cg = cw;
    for (size_t i = 0; i < c.size(); ++i) c[i] = g[i % g.size()] * ((i % 3) ? 1.f : -1.f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = u[(i * 7) % u.size()];
    combine_rows_portable(c.data(), cb, ci, B, I, in.data(), ldin, n, cw.data(), ldout);
    k.combine_rows(c.data(), cb, ci, B, I, in.data(), ldin, n, cg.data(), ldout);
    expect(same_bits(cg, cw), "combine_rows bit for bit the portable one (padding untouched)", B * 1000 + n);
    std::vector<float> sc(c.size()), sw(cw.size(), 7.f), sg = sw;    // combine_signs: coefficients +-1
    for (size_t i = 0; i < c.size(); ++i) sc[i] = c[i] < 0 ? -1.f : 1.f;
    combine_rows_portable(sc.data(), cb, ci, B, I, in.data(), ldin, n, sw.data(), ldout);
    k.combine_signs(sc.data(), cb, ci, B, I, in.data(), ldin, n, sg.data(), ldout);
    expect(same_bits(sg, sw), "combine_signs bit for bit the portable combine_rows", B * 1000 + n);
    std::vector<double> want_d(cw.size(), 7.0);
    double worst = 0, scale = 0;
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < n; ++j) {
        double s = 0, mag = 0;
        for (int i = 0; i < I; ++i) {
          const double t = double(c[size_t(b) * cb + size_t(i) * ci]) * in[size_t(i) * ldin + j];
          s += t, mag += std::fabs(t);
        }
        worst = std::max(worst, std::fabs(cw[size_t(b) * ldout + j] - s)), scale = std::max(scale, mag);
      }
    // I products and I sums in float32, each rounding within 2^-24 of the partial magnitude: I 2^-23 sum|c x|
    expect(worst <= I * 1.2e-7 * scale, "combine_rows vs float64", worst / scale);
  }
  double dd = 0;
  for (int i = 0; i < K; ++i) dd += double(g[i]) * u[i];
  expect(std::fabs(k.dot(g.data(), u.data(), K) - dd) < 1e-4 * std::sqrt(double(K)) * 12, "dot vs float64",
         k.dot(g.data(), u.data(), K) - dd);
}

// Attention over KV8, KV4 and Recent-N against oracle::attention over the cache's bytes dequantized in double. float32
// work per query: dots of D = 64 (<= 64 * 2^-24 of sum |q k|), exp, a softmax sum and a weighted sum over <= 40
// positions: <= ~150 * 2^-24 = 9e-6 even with no cancellation to spare; 1e-5.
static void check_attention(const Kernels& k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  const int hkv = 3, hpk = 3, D = 64, C = 40, first = 28, T = 12;   // T > kQueryTile: two query tiles
  std::vector<uint8_t> b(size_t(2) * hkv * C * D / 2), r(b.size());
  std::vector<uint16_t> s(size_t(2) * hkv * C);
  std::vector<float> v(D);
  for (size_t i = 0; i < s.size(); ++i) {
    for (auto& x : v) x = nd(rng);
    quantize_kv_vector(v.data(), D, &b[i * D / 2], &r[i * D / 2], &s[i]);
  }
  KVLayer kv;
  kv.base = b.data(), kv.refine = r.data(), kv.scale = s.data(), kv.C = C, kv.Hkv = hkv, kv.D = D;
  std::vector<float> q(size_t(T) * hkv * hpk * D), got(q.size()), split(q.size()), scores(size_t(kQueryTile) * hpk * C);
  std::vector<float> kvbuf(size_t(kPosBlock) * D);
  for (auto& x : q) x = nd(rng);
  for (int kv8 : {0, first + T, first - 3}) {       // KV8, KV4, Recent-N
    const KVRange range{first, first, kv8, false, {}};
    for (int h = 0; h < hkv; ++h) {
      k.attend(kv, range, AttendWork{h, 0, hpk, 0, T}, q.data(), hkv * hpk * D, hpk, got.data(), hkv * hpk * D, scores.data(),
               kvbuf.data());
      for (int h0 = 0; h0 < hpk; ++h0)       // one query head and one query at a time: the same bits
        for (int t = 0; t < T; ++t)
          k.attend(kv, range, AttendWork{h, h0, h0 + 1, t, t + 1}, q.data(), hkv * hpk * D, hpk, split.data(),
                   hkv * hpk * D, scores.data(), kvbuf.data());
    }
    const std::vector<double> want = oracle::attention(
        std::vector<double>(q.begin(), q.end()), T, first, hkv * hpk, hkv, D, [&](int which, int h, int pos, int d) {
          const size_t row = (size_t(which) * hkv + h) * C + pos;
          const int q4 = oracle::nibble(&b[row * D / 2], d), qr = oracle::nibble(&r[row * D / 2], d);
          const double sc = oracle::f16(s[row]);
          return pos >= kv8 ? (16.0 * q4 + qr) * sc / 16 : q4 * sc;
        });
    worst_attention = std::max(worst_attention, rel(got, want));
    expect(rel(got, want) < 1e-5, "attention vs float64 oracle", rel(got, want));
    expect(same_bits(split, got), "attention per query head and query equals the whole unit's");
  }
  // Elastic KV: the refinement in a ring of R slots (position p in slot p mod R, the latest write kept), and query t
  // reading KV8 only from position first + t + 1 - W on (a window per query, not per tile).
  const int R = 20, W = 6;                                   // the T queries read KV8 over W + T - 1 = 17 <= R slots
  std::vector<uint8_t> ring(size_t(2) * hkv * R * D / 2);
  for (int pos = 0; pos < first + T; ++pos)
    for (int wh = 0; wh < 2 * hkv; ++wh)
      std::copy(&r[(size_t(wh) * C + pos) * D / 2], &r[(size_t(wh) * C + pos + 1) * D / 2],
                &ring[(size_t(wh) * R + pos % R) * D / 2]);
  KVLayer ekv = kv;
  ekv.refine = ring.data(), ekv.R = R;
  const KVRange range{first, first, 0, false, {}, W};
  for (int h = 0; h < hkv; ++h) {
    k.attend(ekv, range, AttendWork{h, 0, hpk, 0, T}, q.data(), hkv * hpk * D, hpk, got.data(), hkv * hpk * D,
             scores.data(), kvbuf.data());
    for (int h0 = 0; h0 < hpk; ++h0)
      for (int t = 0; t < T; ++t)
        k.attend(ekv, range, AttendWork{h, h0, h0 + 1, t, t + 1}, q.data(), hkv * hpk * D, hpk, split.data(),
                 hkv * hpk * D, scores.data(), kvbuf.data());
  }
  const std::vector<double> want = oracle::attention_rows(
      std::vector<double>(q.begin(), q.end()), T, first, hkv * hpk, hkv, D, [&](int t, int which, int h, int pos, int d) {
        const size_t row = (size_t(which) * hkv + h) * C + pos;   // the unwrapped planes
        const int q4 = oracle::nibble(&b[row * D / 2], d), qr = oracle::nibble(&r[row * D / 2], d);
        const double sc = oracle::f16(s[row]);
        return pos >= first + t + 1 - W ? (16.0 * q4 + qr) * sc / 16 : q4 * sc;
      });
  worst_attention = std::max(worst_attention, rel(got, want));
  expect(rel(got, want) < 1e-5, "elastic attention (ring, per-query window) vs float64 oracle", rel(got, want));
  expect(same_bits(split, got), "elastic attention per query equals the whole unit's (tiles of several queries)");
}

// A job whose member throws mid-way: the others are released from the barriers and run() rethrows.
static void check_pool() {
  Pool pool(2);
  bool thrown = false;
  try {
    pool.run([&](int tid, int) {
      for (int i = 0; i < 3; ++i) {
        if (tid == 1 && i == 1) throw std::runtime_error("worker failure");
        pool.barrier();
      }
    });
  } catch (const std::runtime_error&) {
    thrown = true;
  }
  expect(thrown, "a worker's exception reaches the caller");
  int sum = 0;
  pool.run([&](int tid, int) { pool.barrier(); if (tid == 0) sum = 1; pool.barrier(); });
  expect(sum == 1, "the pool runs the next job after a failed one");
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--list") == 0) {
    std::printf("%s\n", runnable_isas().c_str());
    return 0;
  }
  const Kernels* k = select_kernels(argc > 1 ? argv[1] : "");
  if (!k) {
    std::printf("FAIL kernels %s do not run here (this CPU runs %s)\n", argc > 1 ? argv[1] : "(best)", runnable_isas().c_str());
    return 2;
  }
  std::mt19937 rng(12345);
  check_layout(rng);
  check_linear(*k, rng);
  check_attention(*k, rng);
  check_quantize(*k, rng);
  check_quantize_kv(*k, rng);
  check_tokens(*k, rng);
  check_step(*k);
  check_pool();
  std::printf("%s worst relative error vs the float64 oracle: nested linear %.1e, attention %.1e\n", k->name,
              worst_linear, worst_attention);
  std::printf("%s: %s\n", k->name, failures() ? "failed" : "ok");
  return failures() ? 1 : 0;
}
