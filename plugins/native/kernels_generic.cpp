// Portable kernels (plain C++, any CPU) and the helpers every instruction set shares: float16 conversion,
// activation and KV quantization, the portable per-token work, kernel selection by name. The portable kernels
// define the semantics the vector ones reproduce (the nested linear bit for bit: layout.cpp; float sums of the
// other kernels in each set's own fixed order).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "attend.h"
#include "native.h"

namespace bitnest {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {                                   // subnormal: normalize
      int e = -1;
      do { ++e; man <<= 1; } while (!(man & 0x400));
      bits = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3FF) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | man << 13;     // inf / nan
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = (x >> 16) & 0x8000;
  const uint32_t ax = x & 0x7FFFFFFF;
  if (ax >= 0x7F800000u) return sign | 0x7C00 | (ax > 0x7F800000u ? 0x200 : 0);   // inf / nan
  if (ax >= 0x477FF000u) return sign | 0x7C00;                                     // rounds past 65504: inf
  if (ax < 0x38800000u) {                       // below the smallest normal half: subnormal or zero
    if (ax < 0x33000000u) return sign;          // below half the smallest subnormal
    const uint32_t e = ax >> 23, man = (ax & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;             // value = man * 2^(e - 150) = (man >> shift) units of 2^-24
    uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    return sign | uint16_t(q);
  }
  uint32_t q = ((ax >> 23) - 112) << 10 | (ax & 0x7FFFFF) >> 13;
  const uint32_t rem = ax & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) ++q;   // may carry into the exponent: still correct
  return sign | uint16_t(q);
}

void quantize_acts(const float* x, int ldx, int M, int K, int G, int8_t* xq, int32_t* xsum, float* sx) {
  for (int m = 0; m < M; ++m) {
    const float* xm = x + size_t(m) * ldx;
    float amax = 0.f;
    for (int k = 0; k < K; ++k) amax = std::fmax(amax, std::fabs(xm[k]));
    const float s = std::fmax(amax / 127.f, 1e-12f);
    sx[m] = s;
    int8_t* q = xq + size_t(m) * K;
    int32_t* gs = xsum + size_t(m) * (K / G);
    for (int g = 0; g < K / G; ++g) gs[g] = 0;
    for (int k = 0; k < K; ++k) {
      float v = std::nearbyint(xm[k] / s);                 // round half to even (default rounding mode)
      v = std::fmin(std::fmax(v, -127.f), 127.f);
      q[k] = int8_t(v);
      gs[k / G] += int(v);
    }
  }
}

static inline int nib(int v) { return v & 0xF; }

bool target_fits_int8(const uint8_t* base, const uint8_t* refine, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) {   // q4 = -8 is nibble 0 here; qr < 0 is a nibble below 8
    const uint8_t b = base[i], r = refine[i];
    if (((b & 0xF) == 0 && (r & 0xF) < 8) || ((b >> 4) == 0 && (r >> 4) < 8)) return false;
  }
  return true;
}

void quantize_kv_vector(const float* x, int D, uint8_t* base, uint8_t* refine, uint16_t* scale) {
  float amax = 0.f;
  for (int d = 0; d < D; ++d) amax = std::fmax(amax, std::fabs(x[d]));
  const uint16_t h = f32_to_f16(std::fmax(amax / 7.f, 5.9604644775390625e-08f));   // 2^-24
  const float s = f16_to_f32(h), step = s / 16.f;
  *scale = h;
  for (int d = 0; d < D; d += 2) {
    int q4[2], qr[2];
    for (int i = 0; i < 2; ++i) {
      const float v = x[d + i];
      const float a = std::fmin(std::fmax(std::nearbyint(v / s), -8.f), 7.f);
      const float r = v - a * s;                           // no FMA contraction: built with -ffp-contract=off
      q4[i] = int(a);
      qr[i] = int(std::fmin(std::fmax(std::nearbyint(r / step), -8.f), 7.f));
    }
    base[d / 2] = uint8_t(nib(q4[0]) | nib(q4[1]) << 4);
    refine[d / 2] = uint8_t(nib(qr[0]) | nib(qr[1]) << 4);
  }
}

void silu_mul_portable(float* g, const float* u, int n) {
  for (int i = 0; i < n; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

void rms_norm_portable(const float* x, const uint16_t* w, int n, float eps, float* out) {
  float ss = 0.f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.f / std::sqrt(ss / float(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * inv * f16_to_f32(w[i]);
}

void fwht_portable(float* x, int pre, int f, int post) {
  const float scale = 1.f / std::sqrt(float(f));
  for (int p = 0; p < pre; ++p) {
    float* slab = x + size_t(p) * f * post;
    for (int h = 1; h < f; h *= 2)
      for (int i = 0; i < f; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          float* a = slab + size_t(j) * post;
          float* b = slab + size_t(j + h) * post;
          for (int q = 0; q < post; ++q) {
            const float u = a[q], v = b[q];
            a[q] = u + v, b[q] = u - v;
          }
        }
    for (int i = 0; i < f * post; ++i) slab[i] *= scale;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Portable kernels

static void f16_linear_generic(const uint16_t* w, int K, const float* x, int ldx, int M, float* y, int ldy, int n0,
                               int n1) {
  for (int n = n0; n < n1; ++n) {
    const uint16_t* row = w + size_t(n) * K;
    for (int m = 0; m < M; ++m) {
      const float* xm = x + size_t(m) * ldx;
      float acc = 0.f;
      for (int k = 0; k < K; ++k) acc += f16_to_f32(row[k]) * xm[k];
      y[size_t(m) * ldy + n] = acc;
    }
  }
}

static float dot_generic(const float* a, const float* b, int n) {
  float acc = 0.f;
  for (int i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

void combine_rows_portable(const float* c, int cb, int ci, int B, int I, const float* in, int ldin, int n, float* out,
                           int ldout) {
  for (int b = 0; b < B; ++b) {
    float* o = out + size_t(b) * ldout;
    std::fill(o, o + n, 0.f);
    for (int i = 0; i < I; ++i) {
      const float p = c[size_t(b) * cb + size_t(i) * ci];
      const float* x = in + size_t(i) * ldin;
      for (int j = 0; j < n; ++j) {
        const float prod = p * x[j];   // -ffp-contract=off: never fused with the sum
        o[j] = o[j] + prod;
      }
    }
  }
}

namespace {
struct GenericOps {
  static void dequant(const uint8_t* b, const uint8_t* rf, float s, int D, bool kv8, float* out) {
    dequant_kv_portable(b, rf, s, D, kv8, out);
  }
  static void dots(const float* q, const float* k, int count, int D, float* out) { dots_portable(q, k, count, D, out); }
  static void weighted_sum(float* out, const float* p, const float* v, int count, int D) {
    weighted_sum_portable(out, p, v, count, D);
  }
  static void softmax(float* sc, int n) { softmax_portable(sc, n); }
};
}  // namespace

static void attend_generic(const KVLayer& kv, const KVRange& r, const AttendWork& u, const float* q, int ldq, int hpk,
                           float* out, int ldo, float* scores, float* kvbuf) {
  attend_unit<GenericOps>(kv, r, u, q, ldq, hpk, out, ldo, scores, kvbuf);
}

const Kernels& generic_kernels() {
  static const Kernels k{"generic", nested_linear_rows, f16_linear_generic, attend_generic, quantize_acts,
                         silu_mul_portable, rms_norm_portable, fwht_portable, combine_rows_portable,
                         combine_rows_portable /* signs: products exact */, dot_generic, quantize_kv_vector};
  return k;
}

// Best first: the first that runs here is the default.
static const char* const kIsaNames[] = {"avx512-vnni", "avx-vnni", "avx2", "neon-sdot", "neon-widen", "generic"};

const char* isa_names() { return "avx512-vnni, avx-vnni, avx2, neon-sdot, neon-widen, generic"; }

static const Kernels* by_name(const char* isa) {
  if (std::strcmp(isa, "avx512-vnni") == 0) return avx512_vnni_kernels();
  if (std::strcmp(isa, "avx-vnni") == 0) return avx_vnni_kernels();
  if (std::strcmp(isa, "avx2") == 0) return avx2_kernels();
  if (std::strcmp(isa, "neon-sdot") == 0) {
    const Kernels* k = neon_kernels();
    return k && std::strcmp(k->name, "neon-sdot") == 0 ? k : nullptr;
  }
  if (std::strcmp(isa, "neon-widen") == 0) return neon_widen_kernels();
  if (std::strcmp(isa, "generic") == 0) return &generic_kernels();
  return nullptr;
}

std::string runnable_isas() {
  std::string out;
  for (const char* name : kIsaNames)
    if (by_name(name)) out += (out.empty() ? "" : ", ") + std::string(name);
  return out;
}

const Kernels* select_kernels(const char* isa) {
  if (isa == nullptr || *isa == 0) {
    for (const char* name : kIsaNames)
      if (const Kernels* k = by_name(name)) return k;
    return &generic_kernels();
  }
  return by_name(isa);
}

}  // namespace bitnest
