// Standalone check of the native kernels of one instruction set, without torch: built by tests/test_native_cross.py
// and run natively for every kernel set this CPU runs, and for aarch64 under qemu (the Jetson's NEON paths, with and
// without sdot). Exit 0 when every check holds; one line per failure otherwise.
//
//   check_kernels ISA      (ISA: a name of isa_names(), or "" for the best here)
//
// Checks: the interleaved layout against the canonical planes; the nested linear against a float64 oracle computed
// from the canonical planes (docs/contracts.md), and bit for bit against the portable kernel, one token at a time,
// any slice of rows and any token count; attention against a float64 oracle; the per-token kernels against the
// portable ones (bit for bit where the contract says so); the whole step: a pass equals one-token passes bit for
// bit, each draft-head setting does what it says, and bad calls are refused without deadlocking the threads.
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "native.h"
#include "step.h"

using namespace bitnest;

static int failures = 0;

static void expect(bool ok, const char* what, double value = 0) {
  if (!ok) {
    std::printf("FAIL %s: %g\n", what, value);
    ++failures;
  }
}

template <class A, class B>
static double rel(const std::vector<A>& a, const std::vector<B>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i])), den += double(b[i]) * b[i];
  return std::sqrt(num / (den + 1e-300));
}

static bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// A nested linear with canonical planes (signed nibbles, row-major) and the copy re-laid for the kernels.
struct Linear {
  int N, K, G;
  std::vector<uint8_t> base, refine, lbase, lrefine;   // canonical, laid out
  std::vector<uint16_t> scale, offset, lscale, loffset, bias;
  bool int8 = false;
  int code4(int n, int k) const { return int8_t(uint8_t(base[size_t(n) * K / 2 + k / 2] >> (4 * (k & 1))) << 4) >> 4; }
  int coder(int n, int k) const { return int8_t(uint8_t(refine[size_t(n) * K / 2 + k / 2] >> (4 * (k & 1))) << 4) >> 4; }
  NestedLinear view() const {
    NestedLinear w;
    w.base = lbase.data(), w.refine = lrefine.data(), w.scale = lscale.data(), w.N = N, w.K = K, w.G = G;
    w.offset = offset.empty() ? nullptr : loffset.data(), w.bias = bias.empty() ? nullptr : bias.data();
    w.int8_target = int8;
    return w;
  }
};

// Random planes; `symmetric`: refinement codes >= 0 where the base code is -8 (the symmetric nest), so the
// target's 8-bit code fits int8.
static Linear random_linear(std::mt19937& rng, int n, int k, int g, bool symmetric, bool with_offset = false,
                            bool with_bias = false) {
  Linear l{n, k, g};
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(0.001f, 0.02f), off(-0.05f, 0.05f);
  l.base.resize(size_t(n) * k / 2), l.refine.resize(l.base.size()), l.scale.resize(size_t(n) * k / g);
  for (auto& b : l.base) b = uint8_t(byte(rng));
  for (auto& b : l.refine) b = uint8_t(byte(rng));
  for (auto& s : l.scale) s = f32_to_f16(sc(rng));
  if (with_offset) for (size_t i = 0; i < l.scale.size(); ++i) l.offset.push_back(f32_to_f16(off(rng)));
  if (with_bias) for (int i = 0; i < n; ++i) l.bias.push_back(f32_to_f16(off(rng)));
  if (symmetric)
    for (size_t i = 0; i < l.base.size(); ++i) {      // canonical nibble 8 is -8
      if ((l.base[i] & 15) == 8) l.refine[i] &= 0xF7;
      if ((l.base[i] >> 4) == 8) l.refine[i] &= 0x7F;
    }
  l.lbase = l.base, l.lrefine = l.refine, l.lscale = l.scale, l.loffset = l.offset;
  for (auto* p : {&l.lbase, &l.lrefine})
    for (auto& b : *p) b ^= 0x88;
  l.int8 = symmetric && !with_offset && target_fits_int8(l.lbase.data(), l.lrefine.data(), l.lbase.size());
  interleave_plane(l.lbase.data(), n, k), interleave_plane(l.lrefine.data(), n, k);
  interleave_groups(l.lscale.data(), n, k / g);
  if (with_offset) interleave_groups(l.loffset.data(), n, k / g);
  return l;
}

// docs/contracts.md in float64 from the canonical planes: y = s_x * sum_g (sum_k code * xq) * step_g (+ offset_g *
// sum_g xq) + bias, code = q4 (draft) or 16 q4 + qr at step / 16 (target).
static std::vector<double> oracle(const Linear& l, bool target, const std::vector<int8_t>& xq, const std::vector<float>& sx,
                                  int M) {
  std::vector<double> y(size_t(M) * l.N);
  const int ng = l.K / l.G;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < l.N; ++n) {
      double acc = 0;
      for (int g = 0; g < ng; ++g) {
        long exact = 0, xs = 0;
        for (int k = g * l.G; k < (g + 1) * l.G; ++k) {
          const int code = target ? 16 * l.code4(n, k) + l.coder(n, k) : l.code4(n, k);
          exact += long(code) * xq[size_t(m) * l.K + k], xs += xq[size_t(m) * l.K + k];
        }
        acc += double(exact) * f16_to_f32(l.scale[size_t(n) * ng + g]) / (target ? 16.0 : 1.0);
        if (!l.offset.empty()) acc += double(f16_to_f32(l.offset[size_t(n) * ng + g])) * double(xs);
      }
      y[size_t(m) * l.N + n] = acc * sx[m] + (l.bias.empty() ? 0.0 : f16_to_f32(l.bias[n]));
    }
  return y;
}

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
      std::vector<float> x(size_t(M) * s.K);
      for (auto& v : x) v = nd(rng);
      std::vector<int8_t> xq(x.size());
      std::vector<int32_t> xs(size_t(M) * s.K / s.g);
      std::vector<float> sx(M);
      quantize_acts(x.data(), s.K, M, s.K, s.g, xq.data(), xs.data(), sx.data());
      const QActs a{xq.data(), xs.data(), sx.data(), M, s.K, s.g};
      for (bool target : {false, true}) {
        std::vector<float> want(size_t(M) * s.n), got(want.size()), rows(want.size()), sliced(want.size());
        generic_kernels().nested_linear(w, target, a, want.data(), s.n, 0, s.n);
        k.nested_linear(w, target, a, got.data(), s.n, 0, s.n);
        expect(rel(want, oracle(l, target, xq, sx, M)) < 1e-6, "portable nested_linear vs float64 oracle",
               rel(want, oracle(l, target, xq, sx, M)));
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

static void check_tokens(const Kernels& k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 3.f);
  const int M = 3, K = 1536, G = 128;
  std::vector<float> x(size_t(M) * K);
  for (auto& v : x) v = nd(rng);
  x[7] = 0.5f * 127.f / 9.f;                          // exact ties of x / s round half to even
  std::vector<int8_t> q1(x.size()), q2(x.size());
  std::vector<int32_t> s1(size_t(M) * K / G), s2(s1.size());
  std::vector<float> f1(M), f2(M);
  quantize_acts(x.data(), K, M, K, G, q1.data(), s1.data(), f1.data());
  k.quantize(x.data(), K, M, K, G, q2.data(), s2.data(), f2.data());
  expect(q1 == q2 && s1 == s2 && f1 == f2, "quantize equals the portable codes");
  std::vector<float> g(K), u(K), want, got;
  for (int i = 0; i < K; ++i) g[i] = nd(rng) * 4, u[i] = nd(rng);
  want = got = g;
  silu_mul_portable(want.data(), u.data(), K);
  k.silu_mul(got.data(), u.data(), K);
  expect(rel(got, want) < 1e-6, "silu_mul vs libm", rel(got, want));
  std::vector<uint16_t> w(K);
  for (auto& v : w) v = f32_to_f16(nd(rng));
  want.assign(K, 0), got.assign(K, 0);
  rms_norm_portable(g.data(), w.data(), K, 1e-5f, want.data());
  k.rms_norm(g.data(), w.data(), K, 1e-5f, got.data());
  expect(rel(got, want) < 1e-6, "rms_norm vs portable", rel(got, want));
  for (auto [pre, f, post] : {std::array<int, 3>{12, 128, 1}, std::array<int, 3>{1, 64, 24}, std::array<int, 3>{3, 4, 128},
                              std::array<int, 3>{2, 32, 3}}) {
    want = got = std::vector<float>(g.begin(), g.begin() + pre * f * post);
    fwht_portable(want.data(), pre, f, post);
    k.fwht(got.data(), pre, f, post);
    expect(same_bits(got, want), "fwht bit for bit the portable butterflies", f);
  }
  want = got = u;
  for (int i = 0; i < 5; ++i) {
    for (auto* v : {&want, &got}) (v == &want ? generic_kernels() : k).axpy(0.37f * (i + 1), g.data() + i, v->data(), K - 8);
  }
  expect(same_bits(got, want), "axpy bit for bit the portable one");
  std::vector<float> kvx(size_t(9) * 64);
  for (auto& v : kvx) v = nd(rng) * 2;
  for (int i = 0; i < 64; ++i) kvx[i] = 0.f;                  // an all-zero vector takes the smallest scale
  kvx[64 + 5] = 7.f, kvx[64 + 6] = -3.5f;                     // exact ties of x / s round half to even
  bool kv_same = true;
  for (int v = 0; v < 9; ++v) {
    uint8_t b1[32], r1[32], b2[32], r2[32];
    uint16_t s1, s2;
    quantize_kv_vector(&kvx[size_t(v) * 64], 64, b1, r1, &s1);
    k.quantize_kv(&kvx[size_t(v) * 64], 64, b2, r2, &s2);
    kv_same &= s1 == s2 && !std::memcmp(b1, b2, 32) && !std::memcmp(r1, r2, 32);
  }
  expect(kv_same, "quantize_kv bit for bit the portable KV write");
  double dd = 0;
  for (int i = 0; i < K; ++i) dd += double(g[i]) * u[i];
  expect(std::fabs(k.dot(g.data(), u.data(), K) - dd) < 1e-4 * std::sqrt(double(K)) * 12, "dot vs float64",
         k.dot(g.data(), u.data(), K) - dd);
}

// Causal GQA attention in float64 over the dequantized cache (plugins/reference.py semantics).
static std::vector<double> attention_oracle(const KVLayer& kv, int first, int kv8_from, const std::vector<float>& q,
                                            int T, int hpk) {
  const int D = kv.D, Hq = kv.Hkv * hpk;
  std::vector<double> out(size_t(T) * Hq * D);
  auto value = [&](int which, int h, int pos, int d) {
    const size_t row = (size_t(which) * kv.Hkv + h) * kv.C + pos;
    const uint8_t b = kv.base[row * D / 2 + d / 2], r = kv.refine[row * D / 2 + d / 2];
    const int q4 = int8_t(uint8_t(b >> (4 * (d & 1))) << 4) >> 4, qr = int8_t(uint8_t(r >> (4 * (d & 1))) << 4) >> 4;
    const double s = f16_to_f32(kv.scale[row]);
    return pos >= kv8_from ? (16 * q4 + qr) * s / 16 : q4 * s;
  };
  for (int t = 0; t < T; ++t)
    for (int hq = 0; hq < Hq; ++hq) {
      const int h = hq / hpk, n = first + t + 1;
      std::vector<double> sc(n);
      double mx = -1e300, sum = 0;
      for (int p = 0; p < n; ++p) {
        double d = 0;
        for (int i = 0; i < D; ++i) d += double(q[(size_t(t) * Hq + hq) * D + i]) * value(0, h, p, i);
        sc[p] = d / std::sqrt(double(D)), mx = std::max(mx, sc[p]);
      }
      for (auto& v : sc) sum += (v = std::exp(v - mx));
      for (int i = 0; i < D; ++i) {
        double o = 0;
        for (int p = 0; p < n; ++p) o += sc[p] / sum * value(1, h, p, i);
        out[(size_t(t) * Hq + hq) * D + i] = o;
      }
    }
  return out;
}

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
  for (int kv8 : {0, first + T, first - 3}) {
    const KVRange range{first, first, kv8, false, {}};
    for (int h = 0; h < hkv; ++h) {
      k.attend(kv, range, AttendWork{h, 0, hpk, 0, T}, q.data(), hkv * hpk * D, hpk, got.data(), hkv * hpk * D, scores.data(),
               kvbuf.data());
      for (int h0 = 0; h0 < hpk; ++h0)       // one query head and one query at a time: the same bits
        for (int t = 0; t < T; ++t)
          k.attend(kv, range, AttendWork{h, h0, h0 + 1, t, t + 1}, q.data(), hkv * hpk * D, hpk, split.data(),
                   hkv * hpk * D, scores.data(), kvbuf.data());
    }
    const std::vector<double> want = attention_oracle(kv, first, kv8, q, T, hpk);
    expect(rel(got, want) < 1e-5, "attention vs float64 oracle", rel(got, want));
    expect(same_bits(split, got), "attention per query head and query equals the whole unit's");
  }
}

// A two-layer random model through the whole step.
struct Model {
  StepDims d;
  StepWeights w;
  std::vector<Linear> keep;
  std::vector<uint16_t> embed, ones;
  std::vector<float> cos, sin;
  static constexpr int C = 16, S = 8;
};

static void make_model(Model& md, std::mt19937& rng, DraftHead head, int shortlist) {
  StepDims& d = md.d;
  d.layers = 2, d.hidden = 128, d.intermediate = 256, d.heads = 2, d.kv_heads = 1, d.head_dim = 64, d.vocab = 300;
  d.max_tokens = 8, d.threads = 2, d.draft_head = head, d.shortlist = shortlist;
  const int H = d.hidden, I = d.intermediate, D = d.head_dim, C = Model::C;
  md.keep.reserve(64);
  for (int l = 0; l < d.layers; ++l) {
    const int ks[7] = {H, H, H, 2 * D, H, H, I}, ns[7] = {2 * D, D, D, H, I, I, H};
    for (int i = 0; i < 7; ++i) md.keep.push_back(random_linear(rng, ns[i], ks[i], 64, true));
  }
  md.keep.push_back(random_linear(rng, d.vocab, H, 64, true));
  std::normal_distribution<float> nd(0.f, 1.f);
  md.embed.resize(size_t(d.vocab) * H), md.ones.assign(H, f32_to_f16(1.f));
  for (auto& e : md.embed) e = f32_to_f16(nd(rng) * 0.5f);
  md.cos.resize(size_t(C) * D), md.sin.resize(size_t(C) * D);
  for (int p = 0; p < C; ++p)
    for (int j = 0; j < D; ++j)
      md.cos[size_t(p) * D + j] = std::cos(p * 0.1f * (j % 32 + 1)), md.sin[size_t(p) * D + j] = std::sin(p * 0.1f * (j % 32 + 1));
  for (int l = 0; l < d.layers; ++l) {
    LayerWeights L;
    NestedLinear* dst[7] = {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down};
    for (int i = 0; i < 7; ++i) *dst[i] = md.keep[size_t(l) * 7 + i].view();
    L.input_norm = L.post_norm = md.ones.data();
    md.w.layers.push_back(L);
  }
  md.w.embed = md.embed.data(), md.w.final_norm = md.ones.data(), md.w.head = md.keep.back().view();
  md.w.rope_cos = md.cos.data(), md.w.rope_sin = md.sin.data(), md.w.rope_positions = C;
}

struct Cache {
  std::vector<uint8_t> b, r, sb, sr;
  std::vector<uint16_t> sc, ss;
  std::vector<KVLayer> layers(const StepDims& d) {
    const int C = Model::C, S = Model::S, D = d.head_dim;
    b.assign(size_t(2) * C * D / 2 * d.layers, 0), r = b, sb.assign(size_t(2) * S * D / 2 * d.layers, 0), sr = sb;
    sc.assign(size_t(2) * C * d.layers, 0), ss.assign(size_t(2) * S * d.layers, 0);
    std::vector<KVLayer> kv;
    for (int l = 0; l < d.layers; ++l) {
      KVLayer L;
      L.base = &b[size_t(l) * 2 * C * D / 2], L.refine = &r[size_t(l) * 2 * C * D / 2], L.scale = &sc[size_t(l) * 2 * C];
      L.sbase = &sb[size_t(l) * 2 * S * D / 2], L.srefine = &sr[size_t(l) * 2 * S * D / 2], L.sscale = &ss[size_t(l) * 2 * S];
      L.C = C, L.S = S, L.Hkv = 1, L.D = D;
      kv.push_back(L);
    }
    return kv;
  }
};

static const int64_t kIds[6] = {1, 17, 250, 3, 99, 42};

static std::vector<float> run_step(const Model& md, const Kernels& kern, bool batch, bool target = true) {
  Cache cache;
  DecoderStep step(md.d, md.w, cache.layers(md.d), &kern);
  const int T = 6, V = md.d.vocab;
  std::vector<float> logits(size_t(T) * V);
  if (batch)
    step.forward(kIds, T, target, 0, 0, false, 0, false, logits.data());
  else
    for (int t = 0; t < T; ++t) step.forward(kIds + t, 1, target, t, t, false, 0, false, logits.data() + size_t(t) * V);
  return logits;
}

static void check_step(const Kernels& k, std::mt19937& rng) {
  Model md;
  make_model(md, rng, DraftHead::kBase, 0);
  for (bool target : {true, false}) {
    const std::vector<float> batch = run_step(md, k, true, target), steps = run_step(md, k, false, target),
                             ref = run_step(md, generic_kernels(), true, target);
    expect(same_bits(batch, steps), "step: a pass equals one-token passes");
    expect(rel(batch, ref) < 2e-2, "step vs generic kernels", rel(batch, ref));
  }
  // Draft-head settings: the draft pass's logits after the prefix kIds[0..4], at kIds[5].
  const int V = md.d.vocab;
  auto draft_logits = [&](DraftHead head, int shortlist, bool target) {
    Model m2 = md;
    m2.d.draft_head = head, m2.d.shortlist = shortlist;
    Cache cache;
    DecoderStep step(m2.d, m2.w, cache.layers(m2.d), &k);
    std::vector<float> logits(size_t(5) * V), last(V);
    step.forward(kIds, 5, true, 0, 0, false, 0, false, logits.data());
    step.forward(kIds + 5, 1, target, 5, 5, !target, 0, false, last.data());
    return last;
  };
  const std::vector<float> base = draft_logits(DraftHead::kBase, 0, false), tgt = draft_logits(DraftHead::kBase, 0, true);
  expect(!same_bits(base, tgt), "the base-plane head differs from the target's");
  const std::vector<float> head8 = draft_logits(DraftHead::kTarget, 0, false);
  // the layers still run the draft view: compare the head only through a draft-view model whose head reads 8 bits
  expect(!same_bits(head8, base), "an 8-bit draft head changes the draft's logits");
  const int K = 7;
  const std::vector<float> sl = draft_logits(DraftHead::kShortlist, K, false);
  std::vector<int> order(V);
  for (int i = 0; i < V; ++i) order[i] = i;
  std::partial_sort(order.begin(), order.begin() + K, order.end(),
                    [&](int a, int b) { return base[a] > base[b] || (base[a] == base[b] && a < b); });
  int finite = 0;
  bool rescored = true;
  for (int i = 0; i < V; ++i) finite += std::isfinite(sl[i]);
  for (int i = 0; i < K; ++i) rescored &= std::memcmp(&sl[order[i]], &head8[order[i]], 4) == 0;
  expect(finite == K, "shortlist: every logit outside the shortlist is -inf", finite);
  expect(rescored, "shortlist: the base plane's best rows re-scored at 8 bits, as the 8-bit head");
  // bad calls: refused with an exception, and the threads still run the next pass
  Cache cache;
  DecoderStep step(md.d, md.w, cache.layers(md.d), &k);
  std::vector<float> logits(size_t(6) * V);
  bool refused = false;
  try {
    step.forward(kIds, 2, false, 3, 4, true, 0, false, logits.data());    // a draft pass before the committed length
  } catch (const std::out_of_range&) {
    refused = true;
  }
  expect(refused, "a draft pass starting before the committed length is refused");
  step.forward(kIds, 6, true, 0, 0, false, 0, false, logits.data());
  expect(same_bits(logits, run_step(md, k, true)), "the step runs on after a refused pass");
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
  check_tokens(*k, rng);
  check_step(*k, rng);
  check_pool();
  std::printf("%s: %s\n", k->name, failures ? "failed" : "ok");
  return failures ? 1 : 0;
}
