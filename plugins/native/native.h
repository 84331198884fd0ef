// BitNest native CPU plugins: the data structures shared by the kernels (kernels_*.cpp), the plane layout
// (layout.cpp), the decoder step (step.cpp) and the torch bindings (bindings.cpp). Nothing here depends on torch,
// so the kernels and the step compile and run on their own (tests build them standalone, and for aarch64).
//
// Op semantics are those of plugins/reference.py (docs/contracts.md, ops): per-token symmetric INT8 activations,
// exact int32 group sums, target = (16 q4 + qr) at scale/16, draft = q4 at scale. Every output row is computed by
// the same sequence of operations whatever the number of tokens M in the pass and whatever instruction set runs
// it: the group sums are exact integers and the float work per row (one product and one sum per group, in group
// order) is the same everywhere, so a verification pass over gamma+1 tokens gives bit for bit what gamma+1
// single-token steps give, on every kernel set of a machine.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

namespace bitnest {

constexpr int kRowBlock = 16;     // output rows of one interleaved block (layout below): one zmm of int32 lanes
constexpr int kChunk = 8;         // columns of one block chunk: 4 plane bytes a row
constexpr int kTokenTile = 8;     // tokens sharing one load of every weight chunk
constexpr int kQueryTile = 8;     // queries whose attention shares one dequantization of each cached K/V entry
constexpr int kPosBlock = 64;     // cached positions dequantized at a time (into kPosBlock * D floats)
constexpr int kMaxGroup = 256;    // group sizes the kernels take: 64, 128, 192 or 256 columns

// Weight planes in this backend's layout, made in place at load (layout.cpp) from the canonical planes
// (docs/contracts.md, weights):
//  - every nibble holds code + 8 in [0, 15] (the canonical signed nibble XOR 8), so for the target view the byte
//    16 * base + refine is the 8-bit code + 136 in [0, 255], an unsigned operand of u8 x s8 dot products;
//  - rows in blocks of kRowBlock (the last block may hold fewer, R rows): a block starting at row n0 occupies the
//    plane bytes [n0 * K/2, (n0 + R) * K/2) as K/8 chunks of 4 R bytes; byte 4 r + j of chunk c holds columns
//    8c + j (low nibble) and 8c + 4 + j (high nibble) of row n0 + r. A vector register of 4-byte lanes is then a
//    set of output rows, and the activations of 4 consecutive columns are one broadcast dword.
//  - scales (and offsets) [N, K/G] likewise: the block's R x ng values stored group-major, [ng][R].
// The dot product of a group is then dot(x, nibble) - 8 sum(x) for the draft and dot(x, byte) - 136 sum(x) for
// the target.
struct NestedLinear {
  const uint8_t* base = nullptr;     // [N, K/2] bytes, interleaved
  const uint8_t* refine = nullptr;   // [N, K/2] (never read by the draft view)
  const uint16_t* scale = nullptr;   // float16 [N, K/G], interleaved
  const uint16_t* offset = nullptr;  // float16 [N, K/G] interleaved, or null (top4of8: W = code * step + offset)
  const uint16_t* bias = nullptr;    // float16 [N] (natural order) or null
  int N = 0, K = 0, G = 0;
  // The target's 8-bit code 16 q4 + qr fits int8 everywhere (the symmetric nest: qr >= 0 where q4 = -8): kernels
  // without an unsigned dot product (AVX2) may then take |code| against sign(x, code).
  bool int8_target = false;
};

// True where every 16 q4 + qr of these planes (offset-binary nibbles, any layout) lies in [-128, 127].
bool target_fits_int8(const uint8_t* base, const uint8_t* refine, size_t bytes);

// One pass's INT8 activations for an input of K columns, M tokens (natural column order), their group sums and
// the per-token scale s_x = max|x| / 127.
struct QActs {
  const int8_t* xq = nullptr;     // [M, K]
  const int32_t* xsum = nullptr;  // [M, K/G]
  const float* sx = nullptr;      // [M]
  int M = 0, K = 0, G = 0;
};

// One layer's nested KV cache (docs/contracts.md, KV cache): canonical signed nibbles along D, K then V.
struct KVLayer {
  uint8_t* base = nullptr;       // [2, Hkv, C, D/2]
  uint8_t* refine = nullptr;     // [2, Hkv, R, D/2]: a ring, position p's refinement in slot p mod R (R = C: no wrap)
  uint16_t* scale = nullptr;     // float16 [2, Hkv, C]
  uint8_t* sbase = nullptr;      // draft scratch slots: [2, Hkv, S, D/2]
  uint8_t* srefine = nullptr;
  uint16_t* sscale = nullptr;    // [2, Hkv, S]
  int C = 0, S = 0, Hkv = 0, D = 0, R = 0;   // R: refinement ring slots (0: C)
  int ring() const { return R ? R : C; }
};

// Where the pass's queries sit: query t is at position first + t and sees positions [0, first + t]. Positions
// below `committed` are the committed history (main planes); the others are this pass's own entries, in the
// main planes for a real pass or in scratch slot (position - committed) for a draft pass. Positions before
// `kv8_from` are read at KV4 (base plane only), the others at KV8. With an elastic `window` W > 0 (docs/memory.md,
// elastic KV) query t also reads KV4 before position first + t + 1 - W: per query, so a verification row reads the
// history a one-token step at its position reads.
// `local`, where set, holds this pass's own entries [first, first + M) as [2, Hkv, M, D/2] (and scales [2, Hkv, M]):
// a thread reads them there while one thread writes the same bytes into the cache.
struct KVLocal {
  const uint8_t* base = nullptr;
  const uint8_t* refine = nullptr;
  const uint16_t* scale = nullptr;
  int M = 0;
};
struct KVRange {
  int first = 0, committed = 0, kv8_from = 0;
  bool draft = false;
  KVLocal local;
  int window = 0;
  // First position query t reads at KV8.
  int kv8_from_row(int t) const { return window ? std::max(kv8_from, first + t + 1 - window) : kv8_from; }
};

// One unit of attention work: query heads [h0, h1) of KV head `hkv` (h relative to the group), queries [t0, t1).
struct AttendWork {
  int hkv = 0, h0 = 0, h1 = 0, t0 = 0, t1 = 0;
};

// The kernels of one instruction set; each works on a slice of its output so threads can split it.
struct Kernels {
  const char* name;
  // y[m * ldy + n] = (row n of W_view) . x_m for n in [n0, n1), m < a.M (bias added when present); n0 is a
  // multiple of kRowBlock and n1 one too or N.
  void (*nested_linear)(const NestedLinear& w, bool target, const QActs& a, float* y, int ldy, int n0, int n1);
  // y[m * ldy + n] = w[n, :] . x[m * ldx + :]  (float16 weights [N, K], natural layout)
  void (*f16_linear)(const uint16_t* w, int K, const float* x, int ldx, int M, float* y, int ldy, int n0, int n1);
  // out[t * ldo + h * D + :] for one unit of causal GQA attention over the nested cache; q [T, Hq*D] (rows ldq
  // apart); scores: scratch of kQueryTile * hpk * (first + T) floats; kvbuf: kPosBlock * D floats.
  void (*attend)(const KVLayer& kv, const KVRange& r, const AttendWork& u, const float* q, int ldq, int hpk,
                 float* out, int ldo, float* scores, float* kvbuf);
  // quantize_acts() below, vectorized: the same codes bit for bit
  void (*quantize)(const float* x, int ldx, int M, int K, int G, int8_t* xq, int32_t* xsum, float* sx);
  // g[i] = silu(g[i]) * u[i] for i < n (silu(z) = z / (1 + exp(-z)), exp within 2 ulp of libm's)
  void (*silu_mul)(float* g, const float* u, int n);
  // out[i] = x[i] * (1 / sqrt(mean(x^2) + eps)) * w[i] (w float16), the sum of squares in the set's own fixed order
  void (*rms_norm)(const float* x, const uint16_t* w, int n, float eps, float* out);
  // the butterflies of one Sylvester factor (see fwht_portable): bit for bit the portable result
  void (*fwht)(float* x, int pre, int f, int post);
  // combine_rows_portable() below, vectorized along the columns: the portable result bit for bit
  void (*combine_rows)(const float* c, int cb, int ci, int B, int I, const float* in, int ldin, int n, float* out,
                       int ldout);
  // combine_rows() where every coefficient is +1 or -1: each product is exact, so the kernels may add it by a fused
  // multiply-add (one instruction, the same rounded sum); the portable result bit for bit
  void (*combine_signs)(const float* c, int cb, int ci, int B, int I, const float* in, int ldin, int n, float* out,
                        int ldout);
  // a . b in the kernel set's own fixed summation order
  float (*dot)(const float* a, const float* b, int n);
  // quantize_kv_vector() below, vectorized: the same bytes bit for bit
  void (*quantize_kv)(const float* x, int D, uint8_t* base, uint8_t* refine, uint16_t* scale);
};

const Kernels& generic_kernels();
const Kernels* avx2_kernels();         // null where this build or this CPU has no AVX2 + FMA + F16C
const Kernels* avx_vnni_kernels();     // AVX2 + AVX-VNNI (ymm vpdpbusd)
const Kernels* avx512_vnni_kernels();  // AVX-512 F/BW/VL + VNNI (zmm vpdpbusd), with the OS saving zmm state
const Kernels* neon_kernels();         // null off aarch64: NEON with sdot where the CPU has it, else widening
const Kernels* neon_widen_kernels();   // null off aarch64: NEON without sdot (any ARMv8)
// The best kernels this CPU runs, or the ones named by `isa` (see isa_names()); null if unavailable here.
const Kernels* select_kernels(const char* isa);
// Every name select_kernels() takes, best first; and those of them this CPU runs, comma-separated.
const char* isa_names();
std::string runnable_isas();

// What this x86-64 CPU and its OS support (CPUID and XCR0), all false elsewhere.
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, avx_vnni = false, avx512 = false, avx512_vnni = false;
};
const CpuFeatures& cpu_features();

// Float16 <-> float32, round to nearest even (as torch's .to(torch.float16)).
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Per-token INT8 quantization of x [M, K] (rows ldx apart), natural column order, with group sums (reference
// semantics: s = max(max|x| / 127, 1e-12), q = clamp(round_half_even(x / s), -127, 127)).
void quantize_acts(const float* x, int ldx, int M, int K, int G, int8_t* xq, int32_t* xsum, float* sx);

// The portable forms of the per-token kernels (the semantics the vector ones reproduce).
void silu_mul_portable(float* g, const float* u, int n);
void rms_norm_portable(const float* x, const uint16_t* w, int n, float eps, float* out);
// In place along the middle axis of x [pre, f, post] (f a power of two), scaled by 1/sqrt(f): x @ (Sylvester
// H_f / sqrt(f)), butterflies h = 1, 2, 4 ... in that order.
void fwht_portable(float* x, int pre, int f, int post);
// out[b * ldout + j] = sum over i = 0, 1 .. I-1 in that order of c[b * cb + i * ci] * in[i * ldin + j], for b < B and
// j < n: a small matrix product [B, I] x [I, n] (a Paley factor of a rotation, or token rows times a rotation),
// every product rounded and then added to a sum that starts at +0 (no fused multiply-add), so its bits do not
// depend on the vector width or on how the kernel tiles rows and columns.
void combine_rows_portable(const float* c, int cb, int ci, int B, int I, const float* in, int ldin, int n, float* out,
                           int ldout);

// Nested KV quantization of one vector x [D] (plugins/kv.py): s = max(max|x| / 7, 2^-24) stored as float16 and
// used rounded, q4 = clamp(round(x / s), -8, 7), qr = clamp(round((x - q4 s) / (s / 16)), -8, 7).
void quantize_kv_vector(const float* x, int D, uint8_t* base, uint8_t* refine, uint16_t* scale);

// ---- the interleaved layout (layout.cpp) ----
// Canonical row-major [N, K/2] plane bytes (already offset-binary) -> the interleaved layout, in place.
void interleave_plane(uint8_t* plane, int N, int K);
// Canonical [N, ng] float16 scales or offsets -> block group-major, in place.
void interleave_groups(uint16_t* values, int N, int ng);
// Byte offset in an interleaved plane, and nibble shift, of (row n, column k).
void plane_position(int N, int K, int n, int k, size_t* byte, int* shift);
// Index in interleaved [N, ng] values of (row n, group g).
size_t group_index(int N, int ng, int n, int g);

// The portable nested linear over rows [n0, n1) (any n0, n1): the semantics every kernel set reproduces bit for bit;
// and one of its values, row n for token m.
void nested_linear_rows(const NestedLinear& w, bool target, const QActs& a, float* y, int ldy, int n0, int n1);
float nested_linear_row(const NestedLinear& w, bool target, const QActs& a, int m, int n);

}  // namespace bitnest
