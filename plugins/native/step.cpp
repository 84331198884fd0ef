// The decoder step (step.h): every layer and the head in one call, threads split each linear's output rows and the
// attention's (token, KV head) tasks inside one OpenMP parallel region per chunk of the pass; the small per-token
// work between them (norms, quantization, RoPE, KV writes, rotations) runs on one thread between barriers.
#include "step.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace bitnest {

namespace {

// Thread `tid`'s share [a, b) of n rows, in runs of 8 (a cache line of float outputs).
inline void span(int n, int tid, int nt, int* a, int* b) {
  const int units = (n + 7) / 8, per = units / nt, extra = units % nt;
  const int u0 = tid * per + std::min(tid, extra), u1 = u0 + per + (tid < extra ? 1 : 0);
  *a = std::min(n, u0 * 8), *b = std::min(n, u1 * 8);
}

void rms_norm(const float* x, const uint16_t* w, int H, float eps, float* out) {
  float ss = 0.f;
  for (int i = 0; i < H; ++i) ss += x[i] * x[i];
  const float inv = 1.f / std::sqrt(ss / float(H) + eps);
  for (int i = 0; i < H; ++i) out[i] = x[i] * inv * f16_to_f32(w[i]);
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

// x [n] @ (F_1 kron F_2 kron ...): contract each factor along its own axis (plugins/hadamard.py apply_hadamard).
void kron_apply(float* x, float* buf, int n, const std::vector<int>& orders, const std::vector<const float*>& fs) {
  int pre = 1;
  for (size_t a = 0; a < orders.size(); ++a) {
    const int f = orders[a], post = n / (pre * f);
    const float* F = fs[a];
    for (int p = 0; p < pre; ++p) {
      float* out = buf + size_t(p) * f * post;
      const float* in = x + size_t(p) * f * post;
      for (int b = 0; b < f; ++b) {
        float* o = out + size_t(b) * post;
        for (int j = 0; j < post; ++j) o[j] = 0.f;
        for (int i = 0; i < f; ++i) {
          const float c = F[size_t(i) * f + b];
          const float* src = in + size_t(i) * post;
          for (int j = 0; j < post; ++j) o[j] += src[j] * c;
        }
      }
    }
    std::copy(buf, buf + n, x);
    pre *= f;
  }
}

float silu(float g) { return g / (1.f + std::exp(-g)); }

}  // namespace

std::string unsupported_linear(const NestedLinear& l, const std::string& what) {
  if (l.K % kBlock) return what + ": K=" + std::to_string(l.K) + " is not a multiple of 64";
  if (l.G % kBlock || l.G > kMaxGroup || l.K % l.G)
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
  return "";
}

DecoderStep::DecoderStep(const StepDims& dims, const StepWeights& weights, std::vector<KVLayer> kv,
                         const Kernels* kernels)
    : d_(dims), w_(weights), kv_(std::move(kv)), k_(kernels) {
  if (!k_) throw std::invalid_argument("no kernels for this CPU");
  const std::string why = unsupported(d_, w_);
  if (!why.empty()) throw std::invalid_argument(why);
  const size_t m = size_t(d_.max_tokens), H = d_.hidden, I = d_.intermediate, A = size_t(d_.heads) * d_.head_dim;
  const size_t qkv = A + 2 * size_t(d_.kv_heads) * d_.head_dim;
  const size_t widest = std::max({H, I, A});
  x_.resize(m * H), h_.resize(m * H), qkv_.resize(m * qkv), att_.resize(m * A), tmp_.resize(m * H);
  gate_.resize(m * I), up_.resize(m * I), r4buf_.resize(I);
  xq_.resize(m * widest), xsum_.resize(m * widest / kBlock), sx_.resize(m);
  scores_.resize(size_t(d_.threads) * (d_.heads / d_.kv_heads) * size_t(w_.rope_positions));
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

void DecoderStep::layer(int l, int M, bool target, const KVRange& r, int tid, int nt) {
  const LayerWeights& L = w_.layers[l];
  const int H = d_.hidden, I = d_.intermediate, D = d_.head_dim, hpk = d_.heads / d_.kv_heads;
  const int A = d_.heads * D, KVW = d_.kv_heads * D, Q = A + 2 * KVW;
  QActs qa{xq_.data(), xsum_.data(), sx_.data(), M, H, L.q.G};
#pragma omp single
  {
    for (int t = 0; t < M; ++t) rms_norm(&x_[size_t(t) * H], L.input_norm, H, d_.eps, &h_[size_t(t) * H]);
    quantize_acts(h_.data(), H, M, H, L.q.G, xq_.data(), xsum_.data(), sx_.data());
  }
  const NestedLinear qkv[3] = {L.q, L.k, L.v};
  linear_rows(qkv, 3, target, qa, qkv_.data(), Q, tid, nt);
#pragma omp barrier
#pragma omp single
  {
    const KVLayer& kv = kv_[l];
    for (int t = 0; t < M; ++t) {
      const int pos = r.first + t;
      const float *c = w_.rope_cos + size_t(pos) * D, *s = w_.rope_sin + size_t(pos) * D;
      float* row = &qkv_[size_t(t) * Q];
      for (int h = 0; h < d_.heads + d_.kv_heads; ++h) rope(row + size_t(h) * D, c, s, D);
      for (int j = 0; j < d_.kv_heads; ++j) {
        for (int which = 0; which < 2; ++which) {
          const float* src = row + A + size_t(which) * KVW + size_t(j) * D;
          const bool main = !r.draft;
          const size_t slots = main ? kv.C : kv.S, at = main ? pos : pos - r.committed;
          const size_t idx = (size_t(which) * kv.Hkv + j) * slots + at;
          quantize_kv_vector(src, D, (main ? kv.base : kv.sbase) + idx * (D / 2),
                             (main ? kv.refine : kv.srefine) + idx * (D / 2), (main ? kv.scale : kv.sscale) + idx);
        }
      }
    }
  }
  {
    int a, b;
    const int tasks = M * d_.kv_heads;
    const int per = tasks / nt, extra = tasks % nt;
    a = tid * per + std::min(tid, extra), b = a + per + (tid < extra ? 1 : 0);
    float* scores = &scores_[size_t(tid) * hpk * w_.rope_positions];
    for (int i = a; i < b; ++i)
      k_->attend(kv_[l], r, qkv_.data(), Q, hpk, i % d_.kv_heads, i / d_.kv_heads, i / d_.kv_heads + 1, att_.data(), A,
                 scores);
  }
#pragma omp barrier
#pragma omp single
  quantize_acts(att_.data(), A, M, A, L.o.G, xq_.data(), xsum_.data(), sx_.data());
  {
    const QActs oa{xq_.data(), xsum_.data(), sx_.data(), M, A, L.o.G};
    int n0, n1;
    span(H, tid, nt, &n0, &n1);
    if (n0 < n1) k_->nested_linear(L.o, target, oa, tmp_.data(), H, n0, n1);
    for (int t = 0; t < M; ++t)
      for (int n = n0; n < n1; ++n) x_[size_t(t) * H + n] += tmp_[size_t(t) * H + n];
  }
#pragma omp barrier
#pragma omp single
  {
    for (int t = 0; t < M; ++t) rms_norm(&x_[size_t(t) * H], L.post_norm, H, d_.eps, &h_[size_t(t) * H]);
    quantize_acts(h_.data(), H, M, H, L.gate.G, xq_.data(), xsum_.data(), sx_.data());
  }
  {
    const QActs ga{xq_.data(), xsum_.data(), sx_.data(), M, H, L.gate.G};
    int n0, n1;
    span(I, tid, nt, &n0, &n1);
    if (n0 < n1) {
      k_->nested_linear(L.gate, target, ga, gate_.data(), I, n0, n1);
      k_->nested_linear(L.up, target, ga, up_.data(), I, n0, n1);
    }
    for (int t = 0; t < M; ++t)
      for (int n = n0; n < n1; ++n) gate_[size_t(t) * I + n] = silu(gate_[size_t(t) * I + n]) * up_[size_t(t) * I + n];
  }
#pragma omp barrier
#pragma omp single
  {
    if (!w_.r4_orders.empty())
      for (int t = 0; t < M; ++t) kron_apply(&gate_[size_t(t) * I], r4buf_.data(), I, w_.r4_orders, w_.r4_factors);
    quantize_acts(gate_.data(), I, M, I, L.down.G, xq_.data(), xsum_.data(), sx_.data());
  }
  {
    const QActs da{xq_.data(), xsum_.data(), sx_.data(), M, I, L.down.G};
    int n0, n1;
    span(H, tid, nt, &n0, &n1);
    if (n0 < n1) k_->nested_linear(L.down, target, da, tmp_.data(), H, n0, n1);
    for (int t = 0; t < M; ++t)
      for (int n = n0; n < n1; ++n) x_[size_t(t) * H + n] += tmp_[size_t(t) * H + n];
  }
#pragma omp barrier
}

void DecoderStep::chunk(const int64_t* ids, int M, bool target, const KVRange& r, int rows, float* logits) {
  const int H = d_.hidden;
#pragma omp parallel num_threads(d_.threads)
  {
#ifdef _OPENMP
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    const int tid = 0, nt = 1;
#endif
#pragma omp single
    for (int t = 0; t < M; ++t) {
      const uint16_t* e = w_.embed + size_t(ids[t]) * H;
      float* dst = w_.r1 ? &tmp_[size_t(t) * H] : &x_[size_t(t) * H];
      for (int i = 0; i < H; ++i) dst[i] = f16_to_f32(e[i]);
    }
    if (w_.r1) {                        // x = embedding @ r1, columns split over threads
      int c0, c1;
      span(H, tid, nt, &c0, &c1);
      for (int t = 0; t < M; ++t) {
        const float* e = &tmp_[size_t(t) * H];
        float* out = &x_[size_t(t) * H];
        for (int c = c0; c < c1; ++c) out[c] = 0.f;
        for (int k = 0; k < H; ++k)
          for (int c = c0; c < c1; ++c) out[c] += e[k] * w_.r1[size_t(k) * H + c];
      }
#pragma omp barrier
    }
    for (int l = 0; l < d_.layers; ++l) layer(l, M, target, r, tid, nt);
    if (rows > 0) head(M, rows, target, logits, tid, nt);
  }
}

void DecoderStep::head(int M, int rows, bool target, float* logits, int tid, int nt) {
  const int H = d_.hidden, V = d_.vocab, first_row = M - rows;
  {
    if (w_.r1) {                        // back to the original basis: x @ r1^T
      int c0, c1;
      span(H, tid, nt, &c0, &c1);
      for (int t = first_row; t < M; ++t)
        for (int c = c0; c < c1; ++c) {
          float acc = 0.f;
          for (int k = 0; k < H; ++k) acc += x_[size_t(t) * H + k] * w_.r1[size_t(c) * H + k];
          tmp_[size_t(t) * H + c] = acc;
        }
#pragma omp barrier
    }
#pragma omp single
    {
      const float* src = w_.r1 ? tmp_.data() : x_.data();
      for (int t = first_row; t < M; ++t) rms_norm(src + size_t(t) * H, w_.final_norm, H, d_.eps, &h_[size_t(t) * H]);
      if (w_.head.base)
        quantize_acts(&h_[size_t(first_row) * H], H, rows, H, w_.head.G, xq_.data(), xsum_.data(), sx_.data());
    }
    int n0, n1;
    span(V, tid, nt, &n0, &n1);
    if (n0 < n1) {
      if (w_.head.base) {
        const QActs ha{xq_.data(), xsum_.data(), sx_.data(), rows, H, w_.head.G};
        k_->nested_linear(w_.head, target, ha, logits, V, n0, n1);
      } else {
        k_->f16_linear(w_.head_f16, H, &h_[size_t(first_row) * H], H, rows, logits, V, n0, n1);
      }
    }
  }
}

void DecoderStep::forward(const int64_t* ids, int M, bool target, int start, int committed, bool draft, int kv8_from,
                          bool last_only, float* logits) {
  if (M < 1) throw std::invalid_argument("a pass needs at least one token");
  if (start < 0 || start + M > w_.rope_positions)
    throw std::out_of_range("positions [" + std::to_string(start) + ", " + std::to_string(start + M) +
                            ") exceed the step's capacity " + std::to_string(w_.rope_positions));
  if (draft && start + M - committed > kv_[0].S) throw std::out_of_range("draft pass past the scratch slots");
  for (int t = 0; t < M; ++t)
    if (ids[t] < 0 || ids[t] >= d_.vocab) throw std::out_of_range("token id " + std::to_string(ids[t]) + " out of range");
  for (int c0 = 0; c0 < M; c0 += d_.max_tokens) {
    const int mc = std::min(d_.max_tokens, M - c0);
    const int rows = last_only ? (c0 + mc == M ? 1 : 0) : mc;     // a chunk before the last one of a prefill: no head
    chunk(ids + c0, mc, target, KVRange{start + c0, committed, kv8_from, draft}, rows,
          last_only ? logits : logits + size_t(c0) * d_.vocab);
  }
}

}  // namespace bitnest
