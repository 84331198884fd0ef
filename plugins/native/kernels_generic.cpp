// Portable kernels (plain C++, any CPU) and the helpers every instruction set shares: float16 conversion,
// activation and KV quantization, kernel selection. The portable kernels define the semantics the vector ones
// reproduce (same integers, float sums in their own fixed order).
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

void place_codes(const int32_t* codes, int K, int G, int8_t* xq, int32_t* xsum) {
  for (int g = 0; g < K / G; ++g) xsum[g] = 0;
  for (int k = 0; k < K; ++k) {
    const int b = k / kBlock, j = k % kBlock;            // plane order: even columns, then odd ones
    xq[b * kBlock + (j & 1) * (kBlock / 2) + j / 2] = int8_t(codes[k]);
    xsum[k / G] += codes[k];
  }
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
      const int c = int(v);
      const int b = k / kBlock, j = k % kBlock;            // plane order: even columns, then odd ones
      q[b * kBlock + (j & 1) * (kBlock / 2) + j / 2] = int8_t(c);
      gs[k / G] += c;
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

// ---------------------------------------------------------------------------------------------------------------
// Portable kernels

static void nested_linear_generic(const NestedLinear& w, bool target, const QActs& a, float* y, int ldy, int n0,
                                  int n1) {
  const int K = w.K, G = w.G, ng = K / G, rb = K / 2;
  const int corr = target ? 136 : 8;                       // 16 * 8 + 8, or 8: the +8 offset of every nibble
  for (int n = n0; n < n1; ++n) {
    const uint8_t* b = w.base + size_t(n) * rb;
    const uint8_t* r = target ? w.refine + size_t(n) * rb : nullptr;
    for (int m = 0; m < a.M; ++m) {
      const int8_t* xq = a.xq + size_t(m) * K;
      const int32_t* xs = a.xsum + size_t(m) * ng;
      float acc = 0.f, off = 0.f;
      for (int g = 0; g < ng; ++g) {
        int32_t d4 = 0, dr = 0;
        for (int blk = g * G / kBlock; blk < (g + 1) * G / kBlock; ++blk) {
          const uint8_t* bb = b + blk * (kBlock / 2);
          const int8_t* xe = xq + blk * kBlock;            // even columns (low nibbles), then odd (high)
          for (int j = 0; j < kBlock / 2; ++j) d4 += (bb[j] & 0xF) * xe[j] + (bb[j] >> 4) * xe[j + kBlock / 2];
          if (target) {
            const uint8_t* rr = r + blk * (kBlock / 2);
            for (int j = 0; j < kBlock / 2; ++j) dr += (rr[j] & 0xF) * xe[j] + (rr[j] >> 4) * xe[j + kBlock / 2];
          }
        }
        const int32_t exact = (target ? 16 * d4 + dr : d4) - corr * xs[g];
        const float step = f16_to_f32(w.scale[size_t(n) * ng + g]) * (target ? 1.f / 16.f : 1.f);
        acc += float(exact) * step;
        if (w.offset) off += f16_to_f32(w.offset[size_t(n) * ng + g]) * float(xs[g]);
      }
      float v = (acc + off) * a.sx[m];
      if (w.bias) v += f16_to_f32(w.bias[n]);
      y[size_t(m) * ldy + n] = v;
    }
  }
}

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

static void axpy_generic(float p, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += p * x[i];
}

static void attend_generic(const KVLayer& kv, const KVRange& r, const float* q, int ldq, int hpk, int hkv, int t0,
                           int t1, float* out, int ldo, float* scores) {
  attend_with(dot_generic, axpy_generic, kv, r, q, ldq, hpk, hkv, t0, t1, out, ldo, scores);
}

void silu_mul_portable(float* g, const float* u, int n) {
  for (int i = 0; i < n; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

const Kernels& generic_kernels() {
  static const Kernels k{"generic", nested_linear_generic, f16_linear_generic, attend_generic, quantize_acts,
                         silu_mul_portable};
  return k;
}

const Kernels* select_kernels(const char* isa) {
  if (isa == nullptr || *isa == 0) {
    if (const Kernels* k = avx2_kernels()) return k;
    if (const Kernels* k = neon_kernels()) return k;
    return &generic_kernels();
  }
  if (std::strcmp(isa, "generic") == 0) return &generic_kernels();
  if (std::strcmp(isa, "avx2") == 0) return avx2_kernels();
  if (std::strcmp(isa, "neon") == 0) return neon_kernels();
  if (std::strcmp(isa, "neon-widen") == 0) return neon_widen_kernels();
  return nullptr;
}

}  // namespace bitnest
