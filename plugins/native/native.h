// BitNest native CPU plugins: the data structures shared by the kernels (kernels_*.cpp), the decoder step
// (step.cpp) and the torch bindings (bindings.cpp). Nothing here depends on torch, so the kernels and the step
// compile and run on their own (tests cross-compile them for aarch64).
//
// Op semantics are those of plugins/reference.py (docs/contracts.md, ops): per-token symmetric INT8 activations,
// exact int32 group sums, target = 16*dot(x, q4) + dot(x, qr) at scale/16, draft = dot(x, q4) at scale. Every
// output row is computed by the same sequence of operations whatever the number of tokens M in the pass, so a
// verification pass over gamma+1 tokens gives bit for bit what gamma+1 single-token steps give.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bitnest {

constexpr int kBlock = 64;        // columns per plane block: 32 bytes of nibbles
constexpr int kQueryTile = 8;     // queries whose attention shares one dequantization of each cached K/V entry
constexpr int kMaxGroup = 256;    // int16 partial sums stay exact up to this group size (8 blocks x 2 x 15 x 127 x 2)

// Weight planes in this backend's layout: the canonical signed nibbles (docs/contracts.md, weights) XOR 0x88 in
// place at load, so each nibble holds code + 8 in [0, 15] (an unsigned operand for u8 x s8 dot products); the
// dot product over a group is then dot(x, code + 8) - 8 * sum(x).
struct NestedLinear {
  const uint8_t* base = nullptr;     // [N, K/2]
  const uint8_t* refine = nullptr;   // [N, K/2] (never read by the draft view)
  const uint16_t* scale = nullptr;   // float16 [N, K/G]
  const uint16_t* offset = nullptr;  // float16 [N, K/G] or null (top4of8: W = code * step + offset)
  const uint16_t* bias = nullptr;    // float16 [N] or null
  int N = 0, K = 0, G = 0;
  // The target's 8-bit code 16 q4 + qr fits int8 everywhere (the symmetric nest: qr >= 0 where q4 = -8, and no
  // offset): kernels may then form it once per block and take one dot product per token instead of two.
  bool int8_target = false;
};

// True where every 16 q4 + qr of these planes (offset-binary, see above) lies in [-128, 127].
bool target_fits_int8(const uint8_t* base, const uint8_t* refine, size_t bytes);

// One pass's INT8 activations for an input of K columns, M tokens: xq in plane order (for every 64 columns, the
// 32 even columns then the 32 odd ones, matching the low and high nibbles of 32 plane bytes), group sums of xq
// and the per-token scale s_x = max|x| / 127.
struct QActs {
  const int8_t* xq = nullptr;     // [M, K]
  const int32_t* xsum = nullptr;  // [M, K/G]
  const float* sx = nullptr;      // [M]
  int M = 0, K = 0, G = 0;
};

// One layer's nested KV cache (docs/contracts.md, KV cache): canonical signed nibbles along D, K then V.
struct KVLayer {
  uint8_t* base = nullptr;       // [2, Hkv, C, D/2]
  uint8_t* refine = nullptr;     // [2, Hkv, C, D/2]
  uint16_t* scale = nullptr;     // float16 [2, Hkv, C]
  uint8_t* sbase = nullptr;      // draft scratch slots: [2, Hkv, S, D/2]
  uint8_t* srefine = nullptr;
  uint16_t* sscale = nullptr;    // [2, Hkv, S]
  int C = 0, S = 0, Hkv = 0, D = 0;
};

// Where the pass's queries sit: query t is at position first + t and sees positions [0, first + t]. Positions
// below `committed` are the committed history (main planes); the others are this pass's own entries, in the
// main planes for a real pass or in scratch slot (position - committed) for a draft pass. Positions before
// `kv8_from` are read at KV4 (base plane only), the others at KV8.
struct KVRange {
  int first = 0, committed = 0, kv8_from = 0;
  bool draft = false;
};

// The kernels of one instruction set; each works on a slice [n0, n1) of its output so threads can split it.
struct Kernels {
  const char* name;
  // y[m * ldy + n] = (row n of W_view) . x_m  for n in [n0, n1), m < a.M (bias added when present)
  void (*nested_linear)(const NestedLinear& w, bool target, const QActs& a, float* y, int ldy, int n0, int n1);
  // y[m * ldy + n] = w[n, :] . x[m * ldx + :]  (float16 weights [N, K])
  void (*f16_linear)(const uint16_t* w, int K, const float* x, int ldx, int M, float* y, int ldy, int n0, int n1);
  // out[t * ldo + h * D + :] for the query heads of KV head `hkv`, queries t in [t0, t1): causal GQA attention
  // over the nested cache; q [T, Hq*D] (rows ldq apart); scores: scratch of hq_per_kv * (first + T) floats.
  void (*attend)(const KVLayer& kv, const KVRange& r, const float* q, int ldq, int hq_per_kv, int hkv, int t0,
                 int t1, float* out, int ldo, float* scores);
  // quantize_acts() below, vectorized: the same codes bit for bit
  void (*quantize)(const float* x, int ldx, int M, int K, int G, int8_t* xq, int32_t* xsum, float* sx);
  // g[i] = silu(g[i]) * u[i] for i < n (silu(z) = z / (1 + exp(-z)), exp within 2 ulp of libm's)
  void (*silu_mul)(float* g, const float* u, int n);
};

const Kernels& generic_kernels();
const Kernels* avx2_kernels();     // null where this build or this CPU has no AVX2 + FMA + F16C
const Kernels* neon_kernels();        // null off aarch64: NEON with sdot where the CPU has it, else widening
const Kernels* neon_widen_kernels();  // null off aarch64: NEON without sdot (any ARMv8)
// The best kernels this CPU runs, or the ones named by `isa` ("generic", "avx2", "neon", "neon-widen"); null if
// unavailable.
const Kernels* select_kernels(const char* isa);

// Float16 <-> float32, round to nearest even (as torch's .to(torch.float16)).
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Per-token INT8 quantization of x [M, K] (rows ldx apart) into plane order, with group sums (reference
// semantics: s = max(max|x| / 127, 1e-12), q = clamp(round_half_even(x / s), -127, 127)).
void quantize_acts(const float* x, int ldx, int M, int K, int G, int8_t* xq, int32_t* xsum, float* sx);

// g[i] = silu(g[i]) * u[i] with libm's expf.
void silu_mul_portable(float* g, const float* u, int n);

// INT8 codes [K] in natural column order -> plane order, with their group sums.
void place_codes(const int32_t* codes, int K, int G, int8_t* xq, int32_t* xsum);

// Nested KV quantization of one vector x [D] (plugins/kv.py): s = max(max|x| / 7, 2^-24) stored as float16 and
// used rounded, q4 = clamp(round(x / s), -8, 7), qr = clamp(round((x - q4 s) / (s / 16)), -8, 7).
void quantize_kv_vector(const float* x, int D, uint8_t* base, uint8_t* refine, uint16_t* scale);

}  // namespace bitnest
