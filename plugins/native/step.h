// The decoder step: one whole pass of a Llama/Qwen2 decoder over the nested planes, built once at load with a
// pointer to every plane, the KV cache and a workspace sized for the largest pass, then called once per pass.
// Semantics are edge/model/decoder.py's with the reference ops (docs/contracts.md): RMSNorm, per-token INT8
// activations into every nested linear, RoPE, the online R1 / R4 rotations, nested-KV attention, SiLU * up.
#pragma once

#include <string>
#include <vector>

#include "native.h"
#include "pool.h"

namespace bitnest {

struct LayerWeights {
  NestedLinear q, k, v, o, gate, up, down;
  const uint16_t* input_norm = nullptr;   // float16 [H]
  const uint16_t* post_norm = nullptr;    // float16 [H]
};

// What the draft view reads of a nested head: its base plane (4-bit), its target view (8-bit, as the target), or
// a shortlist: the base plane for every row, then the `shortlist` best rows (larger logit first, lower token id
// first among equals) re-scored at the target view, every other logit -inf.
enum class DraftHead { kBase = 0, kTarget = 1, kShortlist = 2 };

struct StepDims {
  int layers = 0, hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  float eps = 1e-5f;
  int max_tokens = 1;   // rows of the workspace: the largest chunk one call computes at once
  int threads = 1;
  DraftHead draft_head = DraftHead::kBase;
  int shortlist = 0;    // rows re-scored by DraftHead::kShortlist
  int draft_vocab = 0;  // the draft scores token ids [0, draft_vocab) only, every other logit -inf (0: all of them)
  int kv_window = 0;    // elastic KV: each query reads KV8 for its last kv_window positions only (0: no window)
  int draft_rows() const { return draft_vocab ? draft_vocab : vocab; }
};

struct StepWeights {
  std::vector<LayerWeights> layers;
  const uint16_t* embed = nullptr;        // float16 [V, H], or null: rows of the nested tied head's target view
  const uint16_t* final_norm = nullptr;   // float16 [H]
  NestedLinear head;                      // nested head (head.base set), else the float16 `head_f16` [V, H]
  const uint16_t* head_f16 = nullptr;
  const float* r1 = nullptr;              // [H, H]: residual = embedding @ r1, undone (@ r1^T) before the final norm
  std::vector<int> r4_orders;             // Kronecker factors of the online Hadamard before down_proj (empty: none)
  std::vector<const float*> r4_factors;   // each [order, order], orthonormal
  const float* rope_cos = nullptr;        // [positions, D] (rotate-half convention)
  const float* rope_sin = nullptr;
  int rope_positions = 0;
};

// One Kronecker factor of an online Hadamard: its order and orthonormal matrix; Sylvester ones run as a fast transform.
// `signs`, where every entry of the matrix is +-`magnitude` (a Paley factor): the matrix's signs as +-1, so a product
// of rows is the input scaled by `magnitude` once, then sums of signed rows (combine_signs: one fused multiply-add a
// term instead of a product and a sum, and the same bits, since F x = sign (magnitude x) exactly).
struct KronFactor {
  int order;
  const float* matrix;
  bool sylvester;
  const float* signs = nullptr;
  float magnitude = 0.f;
};
// x [n] @ (F_1 kron F_2 kron ...), buf: n floats of scratch; Sylvester factors by the kernels' fast transform,
// the others by the kernels' combine_rows (the portable result bit for bit).
void kron_apply(const Kernels& k, float* x, float* buf, int n, const std::vector<KronFactor>& factors);
// Rows [b0, b1) of that product, x seen as [f_1, n / f_1] with F_1 a matrix (not Sylvester) factor, into the same rows
// of `out` (x unchanged); buf: (b1 - b0) n / f_1 floats; scaled: n floats (F_1 with signs). Rows computed apart are
// the bits kron_apply computes.
void kron_rows(const Kernels& k, const float* x, float* out, float* buf, float* scaled, int n,
               const std::vector<KronFactor>& factors, int b0, int b1);
// `f` with its signs (into `signs`, f * f floats) where every entry of its matrix has the same magnitude.
KronFactor with_signs(KronFactor f, std::vector<float>& signs);

// Checks shapes against what the kernels support; empty when they fit, else the reason (one line).
std::string unsupported_linear(const NestedLinear& l, const std::string& what);
std::string unsupported(const StepDims& d, const StepWeights& w);

class DecoderStep {
 public:
  DecoderStep(const StepDims& dims, const StepWeights& weights, std::vector<KVLayer> kv, const Kernels* kernels);

  // One pass of M tokens at positions start .. start + M - 1 (see KVRange): writes their KV entries (scratch slots
  // for a draft pass) and the logits of every token, or of the last one with `last_only`, into logits [rows, V].
  void forward(const int64_t* ids, int M, bool target, int start, int committed, bool draft, int kv8_from,
               bool last_only, float* logits);

  const Kernels& kernels() const { return *k_; }
  // Bytes of this step's own buffers (shared workspace and every thread's), for the memory plan's check.
  size_t workspace_bytes() const;

 private:
  // One thread's own buffers: its normed and quantized copy of the current input, attention scores, R4 rows,
  // this pass's KV entries (every KV head, read by its attention while one thread writes them to the cache), and
  // the shortlist candidates of its slice of the vocabulary.
  struct Scratch {
    std::vector<float> h, sx, scores, r4, r4buf, krot, kvbuf;
    std::vector<int8_t> xq;
    std::vector<int32_t> xsum;
    std::vector<uint8_t> kvb, kvr;
    std::vector<uint16_t> kvs;
    std::vector<int> cand;
    QActs acts;
  };

  void chunk(const int64_t* ids, int M, bool target, const KVRange& r, int rows, float* logits);
  void head(int M, int rows, bool target, float* logits, int tid, int nt);
  void shortlist_head(int rows, float* logits, int tid, int nt, int n0, int n1);
  void attention(int l, int M, const KVRange& r, int tid, int nt);
  void embed_from_head(int64_t id, int c0, int c1, float* dst) const;
  void layer(int l, int M, bool target, const KVRange& r, int tid, int nt);
  void prepare(Scratch& sc, const float* x, int ld, int M, int K, int G, const uint16_t* norm);
  void residual_rows(const NestedLinear& w, bool target, const QActs& a, int M, int tid, int nt);
  void linear_rows(const NestedLinear* ws, int count, bool target, const QActs& a, float* y, int ldy, int tid, int nt);

  StepDims d_;
  StepWeights w_;
  std::vector<KVLayer> kv_;
  const Kernels* k_;
  std::vector<KronFactor> r4_;
  std::vector<float> r4_signs_;   // the first R4 factor's signs, where it has them (KronFactor::signs)
  // shared workspace, [max_tokens, ...] each, and each thread's own
  std::vector<float> x_, qkv_, att_, tmp_, gate_, up_;
  std::vector<Scratch> scratch_;
  std::vector<int> chosen_;       // [max_tokens, shortlist] rows the shortlist re-scores
  std::vector<float> rescored_;   // [max_tokens, shortlist] their target-view logits
  Pool pool_;
};

}  // namespace bitnest
