// Standalone check of the native kernels of one instruction set against the portable ones, without torch: built
// by tests/test_native_cross.py for aarch64 and run under qemu (the Jetson's NEON paths, with and without sdot),
// or natively. Exit 0 when every check holds; one line per failure otherwise.
//
//   check_kernels ISA      (ISA: neon, avx2, generic)
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "native.h"
#include "step.h"

using namespace bitnest;

static int failures = 0;

static void expect(bool ok, const char* what, double value) {
  if (!ok) {
    std::printf("FAIL %s: %g\n", what, value);
    ++failures;
  }
}

static double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += double(a[i] - b[i]) * (a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / (den + 1e-30));
}

struct Linear {
  std::vector<uint8_t> base, refine;
  std::vector<uint16_t> scale;
  NestedLinear view(int n, int k, int g) const {
    NestedLinear w;
    w.base = base.data(), w.refine = refine.data(), w.scale = scale.data(), w.N = n, w.K = k, w.G = g;
    return w;
  }
};

// Random planes; with `symmetric`, refinement codes >= 0 where the base code is -8 (the symmetric nest's rule),
// so the target's 8-bit code fits int8.
static Linear random_linear(std::mt19937& rng, int n, int k, int g, bool symmetric = false) {
  Linear l;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(0.001f, 0.02f);
  l.base.resize(size_t(n) * k / 2), l.refine.resize(size_t(n) * k / 2), l.scale.resize(size_t(n) * k / g);
  for (auto& b : l.base) b = uint8_t(byte(rng));
  for (auto& b : l.refine) b = uint8_t(byte(rng));
  for (auto& s : l.scale) s = f32_to_f16(sc(rng));
  if (symmetric)
    for (size_t i = 0; i < l.base.size(); ++i) {
      if ((l.base[i] & 15) == 0) l.refine[i] |= 0x08;
      if ((l.base[i] >> 4) == 0) l.refine[i] |= 0x80;
    }
  return l;
}

static void check_linear(const Kernels& k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int g : {64, 128, 256}) for (bool symmetric : {false, true}) {
    const int n = 45, K = 768;
    const Linear l = random_linear(rng, n, K, g, symmetric);
    NestedLinear w = l.view(n, K, g);
    w.int8_target = symmetric;
    expect(target_fits_int8(l.base.data(), l.refine.data(), l.base.size()) == symmetric, "int8 target detected", 0);
    for (int M : {1, 5, 6}) {
      std::vector<float> x(size_t(M) * K);
      for (auto& v : x) v = nd(rng);
      std::vector<int8_t> xq(x.size());
      std::vector<int32_t> xs(size_t(M) * K / g);
      std::vector<float> sx(M);
      quantize_acts(x.data(), K, M, K, g, xq.data(), xs.data(), sx.data());
      const QActs a{xq.data(), xs.data(), sx.data(), M, K, g};
      for (bool target : {false, true}) {
        std::vector<float> want(size_t(M) * n), got(size_t(M) * n), rows(size_t(M) * n);
        generic_kernels().nested_linear(w, target, a, want.data(), n, 0, n);
        k.nested_linear(w, target, a, got.data(), n, 0, n);
        expect(rel(got, want) < 1e-6, "nested_linear vs generic", rel(got, want));
        for (int m = 0; m < M; ++m) {         // one token at a time: bit for bit the same rows
          const QActs one{xq.data() + size_t(m) * K, xs.data() + size_t(m) * (K / g), sx.data() + m, 1, K, g};
          k.nested_linear(w, target, one, rows.data() + size_t(m) * n, n, 0, n);
        }
        expect(std::memcmp(rows.data(), got.data(), got.size() * 4) == 0, "rows independent of M", 0);
      }
    }
  }
}

static void check_elementwise(const Kernels& k, std::mt19937& rng) {
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
  expect(q1 == q2 && s1 == s2 && f1 == f2, "quantize equals the portable codes", 0);
  std::vector<float> g(K), u(K), want, got;
  for (int i = 0; i < K; ++i) g[i] = nd(rng) * 4, u[i] = nd(rng);
  want = got = g;
  silu_mul_portable(want.data(), u.data(), K);
  k.silu_mul(got.data(), u.data(), K);
  expect(rel(got, want) < 1e-6, "silu_mul vs libm", rel(got, want));
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
  std::vector<float> q(size_t(T) * hkv * hpk * D), want(q.size()), got(q.size()), scores(size_t(std::min(T, kQueryTile)) * hpk * C);
  for (auto& x : q) x = nd(rng);
  for (int kv8 : {0, first + T, first - 3}) {
    const KVRange range{first, first, kv8, false};
    for (int h = 0; h < hkv; ++h) {
      generic_kernels().attend(kv, range, q.data(), hkv * hpk * D, hpk, h, 0, T, want.data(), hkv * hpk * D, scores.data());
      k.attend(kv, range, q.data(), hkv * hpk * D, hpk, h, 0, T, got.data(), hkv * hpk * D, scores.data());
    }
    expect(rel(got, want) < 1e-5, "attention vs generic", rel(got, want));
  }
}

// A two-layer random model through the whole step: a 6-token pass equals six one-token passes bit for bit, and
// the logits agree with the portable kernels' (INT8 codes may flip on a last-bit difference: a loose bound).
static void check_step(const Kernels& k, std::mt19937& rng) {
  StepDims d;
  d.layers = 2, d.hidden = 128, d.intermediate = 256, d.heads = 2, d.kv_heads = 1, d.head_dim = 64, d.vocab = 300;
  d.max_tokens = 8, d.threads = 2;
  const int C = 16, S = 8, T = 6, H = d.hidden, I = d.intermediate, D = d.head_dim;
  std::vector<Linear> keep;
  auto lin = [&](int n, int kk) { keep.push_back(random_linear(rng, n, kk, 64)); return keep.size() - 1; };
  std::vector<std::array<size_t, 7>> idx;
  keep.reserve(64);
  for (int l = 0; l < d.layers; ++l)
    idx.push_back({lin(2 * D, H), lin(D, H), lin(D, H), lin(H, 2 * D), lin(I, H), lin(I, H), lin(H, I)});
  const size_t head = lin(d.vocab, H);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> embed(size_t(d.vocab) * H), ones(H, f32_to_f16(1.f));
  for (auto& e : embed) e = f32_to_f16(nd(rng) * 0.5f);
  std::vector<float> cos(size_t(C) * D), sin(size_t(C) * D);
  for (int p = 0; p < C; ++p)
    for (int j = 0; j < D; ++j) cos[size_t(p) * D + j] = std::cos(p * 0.1f * (j % 32 + 1)), sin[size_t(p) * D + j] = std::sin(p * 0.1f * (j % 32 + 1));
  StepWeights w;
  for (int l = 0; l < d.layers; ++l) {
    LayerWeights L;
    const int ks[7] = {H, H, H, 2 * D, H, H, I}, ns[7] = {2 * D, D, D, H, I, I, H};
    NestedLinear* dst[7] = {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down};
    for (int i = 0; i < 7; ++i) *dst[i] = keep[idx[l][i]].view(ns[i], ks[i], 64);
    L.input_norm = L.post_norm = ones.data();
    w.layers.push_back(L);
  }
  w.embed = embed.data(), w.final_norm = ones.data(), w.head = keep[head].view(d.vocab, H, 64);
  w.rope_cos = cos.data(), w.rope_sin = sin.data(), w.rope_positions = C;
  auto run = [&](const Kernels& kern, bool batch) {
    std::vector<uint8_t> b(size_t(2) * C * D / 2 * d.layers), r(b.size()), sb(size_t(2) * S * D / 2 * d.layers), sr(sb.size());
    std::vector<uint16_t> sc(size_t(2) * C * d.layers), ss(size_t(2) * S * d.layers);
    std::vector<KVLayer> kv;
    for (int l = 0; l < d.layers; ++l) {
      KVLayer L;
      L.base = &b[size_t(l) * 2 * C * D / 2], L.refine = &r[size_t(l) * 2 * C * D / 2], L.scale = &sc[size_t(l) * 2 * C];
      L.sbase = &sb[size_t(l) * 2 * S * D / 2], L.srefine = &sr[size_t(l) * 2 * S * D / 2], L.sscale = &ss[size_t(l) * 2 * S];
      L.C = C, L.S = S, L.Hkv = 1, L.D = D;
      kv.push_back(L);
    }
    DecoderStep step(d, w, kv, &kern);
    const int64_t ids[T] = {1, 17, 250, 3, 99, 42};
    std::vector<float> logits(size_t(T) * d.vocab);
    if (batch) {
      step.forward(ids, T, true, 0, 0, false, 0, false, logits.data());
    } else {
      for (int t = 0; t < T; ++t) step.forward(ids + t, 1, true, t, t, false, 0, false, logits.data() + size_t(t) * d.vocab);
    }
    return logits;
  };
  const std::vector<float> batch = run(k, true), steps = run(k, false), ref = run(generic_kernels(), true);
  expect(std::memcmp(batch.data(), steps.data(), batch.size() * 4) == 0, "step: a pass equals one-token passes", 0);
  expect(rel(batch, ref) < 2e-2, "step vs generic kernels", rel(batch, ref));
}

int main(int argc, char** argv) {
  const Kernels* k = select_kernels(argc > 1 ? argv[1] : "");
  if (!k) {
    std::printf("FAIL kernels %s do not run here\n", argc > 1 ? argv[1] : "(best)");
    return 2;
  }
  std::mt19937 rng(12345);
  check_linear(*k, rng);
  check_attention(*k, rng);
  check_elementwise(*k, rng);
  check_step(*k, rng);
  std::printf("%s: %s\n", k->name, failures ? "failed" : "ok");
  return failures ? 1 : 0;
}
