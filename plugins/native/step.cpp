// The decoder step (step.h): every layer and the head in one call. The step's threads (pool.h) split each linear's
// output rows (in whole row blocks) and the attention's (KV head, query head) pairs, and meet at five barriers a
// layer; the small per-token work between them (norms, quantization, the R4 rotation) each thread does for itself
// with the kernel set's vector code rather than wait for one thread.
#include "step.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace bitnest {

namespace {

// Thread `tid`'s share [a, b) of n items, in runs of `unit` (row blocks of a linear, cache lines of floats).
inline void span(int n, int tid, int nt, int* a, int* b, int unit = kRowBlock) {
  const int units = (n + unit - 1) / unit, per = units / nt, extra = units % nt;
  const int u0 = tid * per + std::min(tid, extra), u1 = u0 + per + (tid < extra ? 1 : 0);
  *a = std::min(n, u0 * unit), *b = std::min(n, u1 * unit);
}

// x [D] of one head at position p, rotate-half RoPE (HF Llama): x * cos + rotate_half(x) * sin.
void rope(float* x, const float* cos, const float* sin, int D) {
  float tmp[512];
  const int h = D / 2;
  for (int d = 0; d < D; ++d) tmp[d] = x[d];
  for (int d = 0; d < D; ++d) {
    const float rot = d < h ? -tmp[d + h] : tmp[d - h];
    x[d] = tmp[d] * cos[d] + rot * sin[d];
  }
}

bool is_sylvester(const float* m, int f) {     // the matrix equals Sylvester H_f / sqrt(f)
  if (f & (f - 1)) return false;
  const float v = 1.f / std::sqrt(float(f));
  for (int i = 0; i < f; ++i)
    for (int j = 0; j < f; ++j) {
      const float want = __builtin_popcount(unsigned(i & j)) % 2 ? -v : v;
      if (std::fabs(m[size_t(i) * f + j] - want) > 1e-6f) return false;
    }
  return true;
}

// Rank of logits for the shortlist: larger first, then lower token id.
inline bool better(const float* v, int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); }

// The k best of ids (by `better`) into out, best first.
void best_k(const float* v, const int* ids, int n, int k, int* out) {
  std::vector<int> tmp(ids, ids + n);
  k = std::min(k, n);
  std::partial_sort(tmp.begin(), tmp.begin() + k, tmp.end(), [&](int a, int b) { return better(v, a, b); });
  std::copy(tmp.begin(), tmp.begin() + k, out);
}

}  // namespace

// x [n] @ (F_1 kron F_2 kron ...): contract each factor along its own axis (plugins/hadamard.py apply_hadamard);
// Sylvester factors by the fast transform, others (Paley) by their matrix, output rows as sums of input rows in
// increasing order (combine_rows: out[b] = sum_i F[i, b] in[i], a [f, f] x [f, post] product per slab).
// x [pre, n / pre] with each of the `pre` slabs times (F_first kron ... ), in place.
static void kron_apply(const Kernels& k, float* x, float* buf, int n, int pre, const KronFactor* first,
                       const KronFactor* end) {
  for (const KronFactor* it = first; it != end; ++it) {
    const KronFactor& fac = *it;
    const int f = fac.order, post = n / (pre * f);
    if (fac.sylvester) {
      k.fwht(x, pre, f, post);
      pre *= f;
      continue;
    }
    for (int p = 0; p < pre; ++p)   // coefficient of output row b, input row i: F[i, b]
      k.combine_rows(fac.matrix, 1, f, f, f, x + size_t(p) * f * post, post, post, buf + size_t(p) * f * post, post);
    std::copy(buf, buf + n, x);
    pre *= f;
  }
}

void kron_apply(const Kernels& k, float* x, float* buf, int n, const std::vector<KronFactor>& factors) {
  kron_apply(k, x, buf, n, 1, factors.data(), factors.data() + factors.size());
}

// Rows [b0, b1) of x @ (F_1 kron F_2 kron ...) seen as [f_1, n / f_1], F_1 a matrix factor, into the same rows of
// `out` (x is read whole, not changed): F_1 mixes rows, every later factor acts within one row (its slabs are the
// first factor's rows), so threads may split the rows. The same operations on each value as kron_apply.
void kron_rows(const Kernels& k, const float* x, float* out, float* buf, float* scaled, int n,
               const std::vector<KronFactor>& factors, int b0, int b1) {
  const KronFactor& first = factors.front();
  const int f = first.order, post = n / f;
  if (first.signs) {
    for (int j = 0; j < n; ++j) scaled[j] = first.magnitude * x[j];
    k.combine_signs(first.signs + b0, 1, f, b1 - b0, f, scaled, post, post, out + size_t(b0) * post, post);
  } else {
    k.combine_rows(first.matrix + b0, 1, f, b1 - b0, f, x, post, post, out + size_t(b0) * post, post);
  }
  kron_apply(k, out + size_t(b0) * post, buf, (b1 - b0) * post, b1 - b0, factors.data() + 1,
             factors.data() + factors.size());
}

KronFactor with_signs(KronFactor f, std::vector<float>& signs) {
  const size_t count = size_t(f.order) * f.order;
  const float v = std::fabs(f.matrix[0]);
  for (size_t i = 0; i < count; ++i)
    if (std::fabs(f.matrix[i]) != v) return f;
  signs.resize(count);
  for (size_t i = 0; i < count; ++i) signs[i] = std::signbit(f.matrix[i]) ? -1.f : 1.f;
  f.signs = signs.data(), f.magnitude = v;
  return f;
}

std::string unsupported_linear(const NestedLinear& l, const std::string& what) {
  if (l.K % 64) return what + ": K=" + std::to_string(l.K) + " is not a multiple of 64";
  if (l.G % 64 || l.G > kMaxGroup || l.K % l.G)
    return what + ": group size " + std::to_string(l.G) + " (the native kernels take 64, 128, 192 or 256)";
  return "";
}

std::string unsupported(const StepDims& d, const StepWeights& w) {
  if (d.head_dim > 512 || d.head_dim % 2) return "head dim " + std::to_string(d.head_dim) + " (at most 512, even)";
  if (d.kv_heads < 1 || d.heads % d.kv_heads) return "query heads not a multiple of KV heads";
  for (const LayerWeights& l : w.layers) {
    for (const NestedLinear* x : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) {
      std::string why = unsupported_linear(*x, "a block linear");
      if (!why.empty()) return why;
    }
    if (l.q.G != l.k.G || l.q.G != l.v.G || l.gate.G != l.up.G) return "q/k/v or gate/up with different group sizes";
  }
  if (w.head.base) return unsupported_linear(w.head, "the nested head");
  if (d.draft_head != DraftHead::kBase && !w.head.base) return "a draft head setting needs a nested head";
  if (d.draft_vocab < 0 || d.draft_vocab > d.vocab)
    return "draft vocabulary of " + std::to_string(d.draft_vocab) + " ids (1 .. vocabulary, 0: all)";
  if (d.draft_head == DraftHead::kShortlist && (d.shortlist < 1 || d.shortlist > d.draft_rows()))
    return "shortlist of " + std::to_string(d.shortlist) + " rows (1 .. the draft's vocabulary)";
  return "";
}

DecoderStep::DecoderStep(const StepDims& dims, const StepWeights& weights, std::vector<KVLayer> kv,
                         const Kernels* kernels)
    : d_(dims), w_(weights), kv_(std::move(kv)), k_(kernels), pool_(dims.threads) {
  if (!k_) throw std::invalid_argument("no kernels for this CPU");
  const std::string why = unsupported(d_, w_);
  if (!why.empty()) throw std::invalid_argument(why);
  const size_t m = size_t(d_.max_tokens), H = d_.hidden, I = d_.intermediate, A = size_t(d_.heads) * d_.head_dim;
  const size_t qkv = A + 2 * size_t(d_.kv_heads) * d_.head_dim;
  const size_t widest = std::max({H, I, A});
  x_.resize(m * H), qkv_.resize(m * qkv), att_.resize(m * A), tmp_.resize(m * H), gate_.resize(m * I), up_.resize(m * I);
  for (size_t i = 0; i < w_.r4_orders.size(); ++i)
    r4_.push_back(KronFactor{w_.r4_orders[i], w_.r4_factors[i], is_sylvester(w_.r4_factors[i], w_.r4_orders[i])});
  if (!r4_.empty() && !r4_[0].sylvester) r4_[0] = with_signs(r4_[0], r4_signs_);
  const size_t kv_bytes = 2 * size_t(d_.kv_heads) * m * (d_.head_dim / 2);
  scratch_.resize(d_.threads);
  for (Scratch& sc : scratch_) {
    sc.h.resize(m * widest), sc.xq.resize(m * widest), sc.xsum.resize(m * widest / 64), sc.sx.resize(m);
    sc.scores.resize(size_t(std::min(int(m), kQueryTile)) * (d_.heads / d_.kv_heads) * w_.rope_positions);
    if (!r4_.empty()) sc.r4.resize(m * I), sc.r4buf.resize(I);
    sc.krot.resize(d_.head_dim), sc.kvbuf.resize(size_t(kPosBlock) * d_.head_dim), sc.kvb.resize(kv_bytes), sc.kvr.resize(kv_bytes), sc.kvs.resize(kv_bytes / (d_.head_dim / 2));
    if (d_.draft_head == DraftHead::kShortlist) sc.cand.resize(m * d_.shortlist);
  }
  if (d_.draft_head == DraftHead::kShortlist) chosen_.resize(m * d_.shortlist), rescored_.resize(m * d_.shortlist);
}

size_t DecoderStep::workspace_bytes() const {
  size_t n = 0;
  for (const auto* v : {&x_, &qkv_, &att_, &tmp_, &gate_, &up_, &rescored_}) n += v->size() * sizeof(float);
  n += chosen_.size() * sizeof(int);
  for (const Scratch& sc : scratch_)
    n += (sc.h.size() + sc.sx.size() + sc.scores.size() + sc.r4.size() + sc.r4buf.size() + sc.krot.size() +
          sc.kvbuf.size()) * sizeof(float) +
         sc.xq.size() + sc.xsum.size() * sizeof(int32_t) + sc.kvb.size() + sc.kvr.size() + sc.kvs.size() * 2 +
         sc.cand.size() * sizeof(int);
  return n;
}

void DecoderStep::linear_rows(const NestedLinear* ws, int count, bool target, const QActs& a, float* y, int ldy,
                              int tid, int nt) {
  int total = 0;
  for (int i = 0; i < count; ++i) total += ws[i].N;
  int lo, hi;
  span(total, tid, nt, &lo, &hi);
  for (int i = 0, off = 0; i < count; off += ws[i].N, ++i) {
    const int n0 = std::max(lo, off) - off, n1 = std::min(hi, off + ws[i].N) - off;
    if (n0 < n1) k_->nested_linear(ws[i], target, a, y + off, ldy, n0, n1);
  }
}

// One thread's copy of an input: RMSNorm'd (when `norm`) and quantized, for all M tokens of the chunk. Every thread
// makes its own (a few microseconds) instead of one thread making it behind a barrier.
void DecoderStep::prepare(Scratch& sc, const float* x, int ld, int M, int K, int G, const uint16_t* norm) {
  const float* src = x;
  if (norm) {
    for (int t = 0; t < M; ++t) k_->rms_norm(x + size_t(t) * ld, norm, K, d_.eps, &sc.h[size_t(t) * K]);
    src = sc.h.data(), ld = K;
  }
  k_->quantize(src, ld, M, K, G, sc.xq.data(), sc.xsum.data(), sc.sx.data());
  sc.acts = QActs{sc.xq.data(), sc.xsum.data(), sc.sx.data(), M, K, G};
}

// Rows [n0, n1) of `w` applied to the thread's prepared input, added into x (the residual stream).
void DecoderStep::residual_rows(const NestedLinear& w, bool target, const QActs& a, int M, int tid, int nt) {
  const int H = d_.hidden;
  int n0, n1;
  span(H, tid, nt, &n0, &n1);
  if (n0 >= n1) return;
  k_->nested_linear(w, target, a, tmp_.data(), H, n0, n1);
  for (int t = 0; t < M; ++t)
    for (int n = n0; n < n1; ++n) x_[size_t(t) * H + n] += tmp_[size_t(t) * H + n];
}

// RoPE, the KV entries of the pass and attention, after the q/k/v barrier. Every thread quantizes the pass's own
// K/V entries of every KV head into its scratch (a few hundred values) and reads them there; the threads write
// them into the cache (main planes, or the scratch slots of a draft pass) one KV head each, and nobody reads the
// cache at those positions in this pass. The (KV head, query head) pairs are split evenly between the threads,
// each pair's queries RoPE'd by the thread that attends them.
void DecoderStep::attention(int l, int M, const KVRange& r0, int tid, int nt) {
  const int D = d_.head_dim, hpk = d_.heads / d_.kv_heads, Hkv = d_.kv_heads;
  const int A = d_.heads * D, KVW = Hkv * D, Q = A + 2 * KVW, half = D / 2;
  Scratch& sc = scratch_[tid];
  const KVLayer& kv = kv_[l];
  for (int j = 0; j < Hkv; ++j)
    for (int t = 0; t < M; ++t) {
      const int pos = r0.first + t;
      const float* row = &qkv_[size_t(t) * Q];
      std::copy(row + A + size_t(j) * D, row + A + size_t(j + 1) * D, sc.krot.data());
      rope(sc.krot.data(), w_.rope_cos + size_t(pos) * D, w_.rope_sin + size_t(pos) * D, D);
      for (int which = 0; which < 2; ++which) {
        const size_t at = (size_t(which) * Hkv + j) * M + t;
        k_->quantize_kv(which ? row + A + KVW + size_t(j) * D : sc.krot.data(), D, &sc.kvb[at * half],
                        &sc.kvr[at * half], &sc.kvs[at]);
        if (j % nt != tid) continue;
        const bool main = !r0.draft;
        const size_t slots = main ? kv.C : kv.S, idx = (size_t(which) * Hkv + j) * slots + (main ? pos : pos - r0.committed);
        const size_t ridx = main ? (size_t(which) * Hkv + j) * kv.ring() + pos % kv.ring() : idx;   // refinement ring
        std::copy(&sc.kvb[at * half], &sc.kvb[(at + 1) * half], (main ? kv.base : kv.sbase) + idx * half);
        std::copy(&sc.kvr[at * half], &sc.kvr[(at + 1) * half], (main ? kv.refine : kv.srefine) + ridx * half);
        (main ? kv.scale : kv.sscale)[idx] = sc.kvs[at];
      }
    }
  KVRange r = r0;
  r.local = KVLocal{sc.kvb.data(), sc.kvr.data(), sc.kvs.data(), M};
  int u0, u1;
  span(Hkv * hpk, tid, nt, &u0, &u1, 1);
  for (int u = u0; u < u1;) {
    const int j = u / hpk, h0 = u % hpk, h1 = std::min(hpk, h0 + (u1 - u));
    for (int t = 0; t < M; ++t) {
      const int pos = r.first + t;
      for (int h = h0; h < h1; ++h)
        rope(&qkv_[size_t(t) * Q + (size_t(j) * hpk + h) * D], w_.rope_cos + size_t(pos) * D,
             w_.rope_sin + size_t(pos) * D, D);
    }
    k_->attend(kv, r, AttendWork{j, h0, h1, 0, M}, qkv_.data(), Q, hpk, att_.data(), A, sc.scores.data(),
               sc.kvbuf.data());
    u += h1 - h0;
  }
}

// Five barriers a layer: after q/k/v, after attention, after each residual update and after gate/up.
void DecoderStep::layer(int l, int M, bool target, const KVRange& r, int tid, int nt) {
  const LayerWeights& L = w_.layers[l];
  const int H = d_.hidden, I = d_.intermediate, A = d_.heads * d_.head_dim;
  Scratch& sc = scratch_[tid];
  prepare(sc, x_.data(), H, M, H, L.q.G, L.input_norm);
  const NestedLinear qkv[3] = {L.q, L.k, L.v};
  linear_rows(qkv, 3, target, sc.acts, qkv_.data(), A + 2 * d_.kv_heads * d_.head_dim, tid, nt);
  pool_.barrier();
  attention(l, M, r, tid, nt);
  pool_.barrier();
  prepare(sc, att_.data(), A, M, A, L.o.G, nullptr);
  residual_rows(L.o, target, sc.acts, M, tid, nt);
  pool_.barrier();
  prepare(sc, x_.data(), H, M, H, L.gate.G, L.post_norm);
  {
    int n0, n1;
    span(I, tid, nt, &n0, &n1);
    if (n0 < n1) {
      k_->nested_linear(L.gate, target, sc.acts, gate_.data(), I, n0, n1);
      k_->nested_linear(L.up, target, sc.acts, up_.data(), I, n0, n1);
      for (int t = 0; t < M; ++t) k_->silu_mul(&gate_[size_t(t) * I + n0], &up_[size_t(t) * I + n0], n1 - n0);
    }
  }
  pool_.barrier();
  const float* g = gate_.data();
  if (!r4_.empty() && !r4_[0].sylvester) {   // the online R4, its first factor's rows over threads, into up_ (free
    int b0, b1;                               // since silu_mul)
    span(r4_[0].order, tid, nt, &b0, &b1, 1);
    if (b0 < b1)
      for (int t = 0; t < M; ++t)
        kron_rows(*k_, &gate_[size_t(t) * I], &up_[size_t(t) * I], sc.r4buf.data(), sc.r4.data(), I, r4_, b0, b1);
    pool_.barrier();
    g = up_.data();
  } else if (!r4_.empty()) {            // a Sylvester first factor (butterflies over the whole row): this thread's copy
    for (int t = 0; t < M; ++t) {
      float* row = &sc.r4[size_t(t) * I];
      std::copy(&gate_[size_t(t) * I], &gate_[size_t(t) * I] + I, row);
      kron_apply(*k_, row, sc.r4buf.data(), I, r4_);
    }
    g = sc.r4.data();
  }
  prepare(sc, g, I, M, I, L.down.G, nullptr);
  residual_rows(L.down, target, sc.acts, M, tid, nt);
  pool_.barrier();
}

// Columns [c0, c1) of the target view of the nested head's row `id`, (16 q4 + qr) s / 16 (+ offset): the input
// embedding of a checkpoint whose tied head is nested (no float16 copy), read from the interleaved planes.
void DecoderStep::embed_from_head(int64_t id, int c0, int c1, float* dst) const {
  const NestedLinear& h = w_.head;
  const int ng = h.K / h.G;
  for (int i = c0; i < c1; ++i) {
    size_t byte;
    int sh;
    plane_position(h.N, h.K, int(id), i, &byte, &sh);
    const int q4 = ((h.base[byte] >> sh) & 0xF) - 8, qr = ((h.refine[byte] >> sh) & 0xF) - 8;   // code + 8 each
    const size_t g = group_index(h.N, ng, int(id), i / h.G);
    float v = float(16 * q4 + qr) * (f16_to_f32(h.scale[g]) / 16.f);
    if (h.offset) v += f16_to_f32(h.offset[g]);
    dst[i] = v;
  }
}

void DecoderStep::chunk(const int64_t* ids, int M, bool target, const KVRange& r, int rows, float* logits) {
  const int H = d_.hidden;
  pool_.run([&](int tid, int nt) {
    {  // embedding rows (into x, or into tmp for the R1 rotation), this thread's columns
      int c0, c1;
      span(H, tid, nt, &c0, &c1, 8);
      for (int t = 0; t < M; ++t) {
        float* dst = w_.r1 ? &tmp_[size_t(t) * H] : &x_[size_t(t) * H];
        if (w_.embed) {
          const uint16_t* e = w_.embed + size_t(ids[t]) * H;
          for (int i = c0; i < c1; ++i) dst[i] = f16_to_f32(e[i]);
        } else {
          embed_from_head(ids[t], c0, c1, dst);
        }
      }
      pool_.barrier();
      if (w_.r1 && c0 < c1)   // x = embedding @ r1: rows of r1 summed in order (each read once for every token),
        k_->combine_rows(tmp_.data(), H, 1, M, H, w_.r1 + c0, H, c1 - c0, x_.data() + c0, H);   // columns over threads
      if (w_.r1) pool_.barrier();
    }
    for (int l = 0; l < d_.layers; ++l) layer(l, M, target, r, tid, nt);
    if (rows > 0) head(M, rows, target, logits, tid, nt);
  });
  if (rows > 0 && !target && d_.draft_head == DraftHead::kShortlist) {
    const int K = d_.shortlist, V = d_.vocab;
    for (int t = 0; t < rows; ++t)
      for (int i = 0; i < K; ++i) logits[size_t(t) * V + chosen_[size_t(t) * K + i]] = rescored_[size_t(t) * K + i];
  }
}

void DecoderStep::head(int M, int rows, bool target, float* logits, int tid, int nt) {
  const int H = d_.hidden, V = d_.vocab, first_row = M - rows;
  if (w_.r1) {                          // back to the original basis: x @ r1^T, columns split over threads
    int c0, c1;
    span(H, tid, nt, &c0, &c1, 8);
    for (int t = first_row; t < M; ++t)
      for (int c = c0; c < c1; ++c) tmp_[size_t(t) * H + c] = k_->dot(&x_[size_t(t) * H], w_.r1 + size_t(c) * H, H);
    pool_.barrier();
  }
  Scratch& sc = scratch_[tid];
  const float* src = (w_.r1 ? tmp_.data() : x_.data()) + size_t(first_row) * H;
  const int scored = target ? V : d_.draft_rows();   // the draft reads no row past its vocabulary
  int n0, n1;
  span(scored, tid, nt, &n0, &n1);
  if (w_.head.base) {
    prepare(sc, src, H, rows, H, w_.head.G, w_.final_norm);
    const bool view = target || d_.draft_head == DraftHead::kTarget;
    if (n0 < n1) k_->nested_linear(w_.head, view, sc.acts, logits, V, n0, n1);
    if (!target && d_.draft_head == DraftHead::kShortlist) shortlist_head(rows, logits, tid, nt, n0, n1);
  } else {
    for (int t = 0; t < rows; ++t) k_->rms_norm(src + size_t(t) * H, w_.final_norm, H, d_.eps, &sc.h[size_t(t) * H]);
    if (n0 < n1) k_->f16_linear(w_.head_f16, H, sc.h.data(), H, rows, logits, V, n0, n1);
  }
  if (scored < V) {                     // ids past the draft's vocabulary: -inf, split over threads
    int e0, e1;
    span(V - scored, tid, nt, &e0, &e1, 1);
    for (int t = 0; t < rows; ++t)
      std::fill(logits + size_t(t) * V + scored + e0, logits + size_t(t) * V + scored + e1,
                -std::numeric_limits<float>::infinity());
  }
}

// The draft's shortlist head, after each thread wrote the base-plane logits of its rows [n0, n1): each thread keeps
// the best `shortlist` rows of its slice, one thread merges them into the best of all, the threads re-score those
// rows at the target view (the portable row kernel: the same bits as the target's head) and set every logit of
// their slice to -inf; the caller writes the re-scored logits in after the pass (DecoderStep::chunk).
void DecoderStep::shortlist_head(int rows, float* logits, int tid, int nt, int n0, int n1) {
  const int K = d_.shortlist, V = d_.vocab;
  Scratch& sc = scratch_[tid];
  std::vector<int> ids(std::max(0, n1 - n0));
  for (int i = 0; i < n1 - n0; ++i) ids[i] = n0 + i;
  for (int t = 0; t < rows; ++t) {
    int* mine = &sc.cand[size_t(t) * K];
    std::fill(mine, mine + K, -1);
    best_k(logits + size_t(t) * V, ids.data(), int(ids.size()), K, mine);
  }
  pool_.barrier();
  if (tid == 0)
    for (int t = 0; t < rows; ++t) {
      std::vector<int> all;
      for (const Scratch& other : scratch_)
        for (int i = 0; i < K; ++i)
          if (other.cand[size_t(t) * K + i] >= 0) all.push_back(other.cand[size_t(t) * K + i]);
      best_k(logits + size_t(t) * V, all.data(), int(all.size()), K, &chosen_[size_t(t) * K]);
    }
  pool_.barrier();
  int i0, i1;
  span(rows * K, tid, nt, &i0, &i1, 1);
  for (int i = i0; i < i1; ++i) {
    rescored_[i] = nested_linear_row(w_.head, true, sc.acts, i / K, chosen_[i]);
  }
  for (int t = 0; t < rows; ++t)
    std::fill(logits + size_t(t) * V + n0, logits + size_t(t) * V + n1, -std::numeric_limits<float>::infinity());
}

void DecoderStep::forward(const int64_t* ids, int M, bool target, int start, int committed, bool draft, int kv8_from,
                          bool last_only, float* logits) {
  if (M < 1) throw std::invalid_argument("a pass needs at least one token");
  if (start < 0 || start + M > w_.rope_positions)
    throw std::out_of_range("positions [" + std::to_string(start) + ", " + std::to_string(start + M) +
                            ") exceed the step's capacity " + std::to_string(w_.rope_positions));
  if (committed < 0 || committed > w_.rope_positions)
    throw std::out_of_range("committed length " + std::to_string(committed) + " outside the step's capacity");
  if (draft && start < committed)
    throw std::out_of_range("a draft pass at position " + std::to_string(start) + " starts before the committed length " +
                            std::to_string(committed));
  if (draft && start + M - committed > kv_[0].S) throw std::out_of_range("draft pass past the scratch slots");
  for (int t = 0; t < M; ++t)
    if (ids[t] < 0 || ids[t] >= d_.vocab) throw std::out_of_range("token id " + std::to_string(ids[t]) + " out of range");
  for (int c0 = 0; c0 < M; c0 += d_.max_tokens) {
    const int mc = std::min(d_.max_tokens, M - c0);
    const int rows = last_only ? (c0 + mc == M ? 1 : 0) : mc;     // a chunk before the last one of a prefill: no head
    chunk(ids + c0, mc, target, KVRange{start + c0, committed, kv8_from, draft, {}, d_.kv_window}, rows,
          last_only ? logits : logits + size_t(c0) * d_.vocab);
  }
}

}  // namespace bitnest
