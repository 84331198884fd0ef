// The whole decoder step of the standalone kernel check (see check_kernels.cpp): a two-layer random model whose
// passes are compared with a float64 oracle of the step (oracle.h pieces in the step's order: embedding, RMSNorm,
// INT8 activations into every nested linear, RoPE, the KV8 entries the pass writes, causal GQA attention, SiLU * up,
// the nested head), a pass against one-token passes bit for bit, each draft-head setting, a refused pass.
#include <algorithm>
#include <array>
#include <limits>
#include <stdexcept>

#include "check.h"
#include "step.h"

namespace check {

// The logits of a 6-token pass against the float64 oracle, ||got - oracle|| / ||oracle||. float32 against double
// through two layers and the head, with every code rounded as the oracle rounds it: measured <= 2e-7 on every kernel
// set here (printed per run); 1e-5 leaves 50x for other CPUs' libm and summation orders, and is ~1000x below what one
// flipped INT8 or KV code does to these logits (~1e-2), which step_error tells apart.
constexpr double kStepRel = 1e-5;
constexpr unsigned kStepSeed = 1;   // the model's own seed: it does not move when the other checks draw more numbers

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

// The pass of run_step in float64 (step.h semantics, every entry read at KV8): logits [T, V].
static std::vector<double> step_oracle(const Model& md, bool target, int T) {
  const StepDims& d = md.d;
  const int H = d.hidden, D = d.head_dim, Hq = d.heads, Hkv = d.kv_heads;
  std::vector<double> x(size_t(T) * H), h(x.size());
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) x[size_t(t) * H + i] = oracle::f16(md.embed[size_t(kIds[t]) * H + i]);
  auto normed = [&](const uint16_t* w) {
    for (int t = 0; t < T; ++t) {
      const std::vector<double> r = oracle::rms_norm(&x[size_t(t) * H], w, H, d.eps);
      std::copy(r.begin(), r.end(), &h[size_t(t) * H]);
    }
    return h;
  };
  for (int l = 0; l < d.layers; ++l) {
    const Linear* L = &md.keep[size_t(l) * 7];
    const oracle::Acts in = oracle::quantize_acts(normed(md.ones.data()), T, H);      // one quantization for q, k, v
    std::vector<double> q = oracle::linear(L[0].planes(), target, in.q, in.s, T),
                        k = oracle::linear(L[1].planes(), target, in.q, in.s, T),
                        v = oracle::linear(L[2].planes(), target, in.q, in.s, T);
    std::vector<oracle::KV> ks, vs;                               // [T, Hkv] entries, as the pass writes them
    for (int t = 0; t < T; ++t) {
      for (int j = 0; j < Hq; ++j) oracle::rope(&q[(size_t(t) * Hq + j) * D], &md.cos[size_t(t) * D], &md.sin[size_t(t) * D], D);
      for (int j = 0; j < Hkv; ++j) {
        oracle::rope(&k[(size_t(t) * Hkv + j) * D], &md.cos[size_t(t) * D], &md.sin[size_t(t) * D], D);
        ks.push_back(oracle::quantize_kv(&k[(size_t(t) * Hkv + j) * D], D));
        vs.push_back(oracle::quantize_kv(&v[(size_t(t) * Hkv + j) * D], D));
      }
    }
    const std::vector<double> att = oracle::attention(q, T, 0, Hq, Hkv, D, [&](int which, int j, int pos, int i) {
      return oracle::kv_value((which ? vs : ks)[size_t(pos) * Hkv + j], i, true);
    });
    const std::vector<double> o = oracle::linear(L[3].planes(), target, att, T);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    const oracle::Acts post = oracle::quantize_acts(normed(md.ones.data()), T, H);    // and for gate, up
    std::vector<double> g = oracle::linear(L[4].planes(), target, post.q, post.s, T);
    const std::vector<double> u = oracle::linear(L[5].planes(), target, post.q, post.s, T);
    for (size_t i = 0; i < g.size(); ++i) g[i] = oracle::silu(g[i]) * u[i];
    const std::vector<double> down = oracle::linear(L[6].planes(), target, g, T);
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
  }
  return oracle::linear(md.keep.back().planes(), target, normed(md.ones.data()), T);
}

// ||logits - oracle|| / ||oracle|| for the oracle's pass as it rounds, or, where that exceeds kStepRel, the least over
// the passes with up to three of its near-boundary roundings (oracle::Rounding) taken the other way: a flipped INT8
// or KV code moves these logits by up to ~1e-2 (and moves later values, so the near-boundary decisions after it are
// those of the flipped pass), so the kernels must match one legitimate rounding of the contract to kStepRel, not the
// oracle's choices between codes float32 cannot tell apart. *flips: how many it took.
static double step_error(const std::vector<float>& got, const Model& md, bool target, int* flips,
                         std::vector<long> flip = {}) {
  oracle::Rounding r;
  r.flip = flip;
  oracle::rounding() = &r;
  double best = rel(got, step_oracle(md, target, 6));
  oracle::rounding() = nullptr;
  *flips = int(flip.size());
  if (best < kStepRel || flip.size() == 3) return best;
  for (long n : r.near) {           // a decision after the last flip (flips change nothing before them)
    if (!flip.empty() && n <= flip.back()) continue;
    std::vector<long> more = flip;
    more.push_back(n);
    int f;
    const double e = step_error(got, md, target, &f, more);
    if (e < best) best = e, *flips = f;
    if (best < kStepRel) break;
  }
  return best;
}

// The online R4 as the step splits it over threads: rows of its first (matrix) factor computed apart, in two and in
// three ranges, equal the whole product bit for bit (a 12-row matrix factor, then Sylvester 4, then a 3-row matrix
// factor: every later factor stays within a first-factor row), and the product is within float32 rounding of float64.
// A first factor whose entries are +-v (a Paley factor's shape) runs from its signs (with_signs): the same bits.
static void check_rotation(const Kernels& k, std::mt19937& rng) {
  const int n = 12 * 4 * 3;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> p12(12 * 12), p3(3 * 3), h4(16), x(n), s12(12 * 12), signs;
  for (auto* m : {&p12, &p3, &x})
    for (float& v : *m) v = nd(rng);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) h4[i * 4 + j] = (__builtin_popcount(i & j) % 2 ? -0.5f : 0.5f);
  for (size_t i = 0; i < s12.size(); ++i) s12[i] = (p12[i] < 0 ? -1.f : 1.f) / std::sqrt(12.f);
  const std::vector<KronFactor> fs = {{12, p12.data(), false}, {4, h4.data(), true}, {3, p3.data(), false}};
  const KronFactor signed12 = with_signs({12, s12.data(), false}, signs);
  expect(signed12.signs && !with_signs(fs[0], signs).signs, "signs found for a +-v factor only");
  const std::vector<KronFactor> ss = {signed12, fs[1], fs[2]}, plain = {{12, s12.data(), false}, fs[1], fs[2]};
  std::vector<float> whole = x, swhole = x, buf(n), scaled(n);
  kron_apply(k, whole.data(), buf.data(), n, fs);
  kron_apply(k, swhole.data(), buf.data(), n, plain);
  for (const std::vector<int>& cuts : {std::vector<int>{0, 5, 12}, std::vector<int>{0, 1, 7, 12}}) {
    std::vector<float> split(n, -1.f), ssplit(n, -1.f);
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      kron_rows(k, x.data(), split.data(), buf.data(), scaled.data(), n, fs, cuts[c], cuts[c + 1]);
      kron_rows(k, x.data(), ssplit.data(), buf.data(), scaled.data(), n, ss, cuts[c], cuts[c + 1]);
    }
    expect(same_bits(split, whole), "R4 rows computed apart equal the whole product", int(cuts.size()) - 1);
    expect(same_bits(ssplit, swhole), "R4 rows from a factor's signs equal the whole product", int(cuts.size()) - 1);
  }
  double worst = 0, norm = 0;   // x @ (P12 kron H4 kron P3): index (a, b, c) = 12-row a, 4-row b, 3-row c
  for (int a = 0; a < 12; ++a)
    for (int b = 0; b < 4; ++b)
      for (int c = 0; c < 3; ++c) {
        double s = 0;
        for (int i = 0; i < 12; ++i)
          for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 3; ++l)
              s += double(x[(i * 4 + j) * 3 + l]) * p12[i * 12 + a] * h4[j * 4 + b] * p3[l * 3 + c];
        worst = std::max(worst, std::fabs(s - whole[(a * 4 + b) * 3 + c])), norm = std::max(norm, std::fabs(s));
      }
  expect(worst < 1e-5 * std::max(1.0, norm) * 12, "R4 product vs float64", worst);
}

void check_step(const Kernels& k) {
  std::mt19937 rng(kStepSeed);
  Model md;
  make_model(md, rng, DraftHead::kBase, 0);
  for (bool target : {true, false}) {
    const std::vector<float> batch = run_step(md, k, true, target), steps = run_step(md, k, false, target);
    expect(same_bits(batch, steps), "step: a pass equals one-token passes");
    int flips = 0;
    const double err = step_error(batch, md, target, &flips);
    std::printf("%s step %s vs float64 oracle: rel %.1e (%d of its near-boundary roundings taken the other way)\n", k.name,
                target ? "target" : "draft", err, flips);
    expect(err < kStepRel, target ? "target step vs float64 oracle" : "draft step vs float64 oracle", err);
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
  check_rotation(k, rng);
}

}  // namespace check
