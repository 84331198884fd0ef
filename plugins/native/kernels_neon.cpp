// NEON kernels (aarch64: the Jetson Orin's Cortex-A78AE cores), chosen at run time. With the dot-product extension
// (ARMv8.2 `sdot`, HWCAP_ASIMDDP) each 4 nibble x INT8 products go straight into int32 lanes; without it, widening
// multiplies into int16 (at most 15 x 127) and pairwise accumulation into int32. The nibbles hold code + 8 (see
// native.h), so a group's exact integer is dot(x, nibble) - 8 (or 136 for the target) * sum(x), as on x86.
#include "native.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>

#include "attend.h"

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif

namespace bitnest {

// The nested linear, written once in neon_linear.inc and compiled twice: with the dot-product extension enabled
// (sdot) and without it (widening multiplies), each as its own function.
static inline int32x4_t dot16_widen(int32x4_t acc, uint8x16_t w, int8x16_t x) {
  const int8x16_t ws = vreinterpretq_s8_u8(w);
  acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(ws), vget_low_s8(x)));
  return vpadalq_s16(acc, vmull_high_s8(ws, x));
}
#define BN_DOT16 dot16_widen
#define BN_LINEAR nested_linear_widen
#include "neon_linear.inc"
#undef BN_DOT16
#undef BN_LINEAR

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
static inline int32x4_t dot16_sdot(int32x4_t acc, uint8x16_t w, int8x16_t x) {
  return vdotq_s32(acc, vreinterpretq_s8_u8(w), x);
}
#define BN_DOT16 dot16_sdot
#define BN_LINEAR nested_linear_sdot
#include "neon_linear.inc"
#undef BN_DOT16
#undef BN_LINEAR
#pragma GCC pop_options

static void f16_linear_neon(const uint16_t* w, int K, const float* x, int ldx, int M, float* y, int ldy, int n0,
                            int n1) {
  for (int n = n0; n < n1; ++n) {
    const float16_t* row = reinterpret_cast<const float16_t*>(w + size_t(n) * K);
    for (int m = 0; m < M; ++m) {
      const float* xm = x + size_t(m) * ldx;
      float32x4_t acc = vdupq_n_f32(0.f);
      int k = 0;
      for (; k + 4 <= K; k += 4) acc = vfmaq_f32(acc, vcvt_f32_f16(vld1_f16(row + k)), vld1q_f32(xm + k));
      float v = vaddvq_f32(acc);
      for (; k < K; ++k) v += float(row[k]) * xm[k];
      y[size_t(m) * ldy + n] = v;
    }
  }
}

static float dot_neon(const float* a, const float* b, int n) {
  float32x4_t acc = vdupq_n_f32(0.f);
  int i = 0;
  for (; i + 4 <= n; i += 4) acc = vfmaq_f32(acc, vld1q_f32(a + i), vld1q_f32(b + i));
  float s = vaddvq_f32(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

static void axpy_neon(float p, const float* x, float* y, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), p));
  for (; i < n; ++i) y[i] += p * x[i];
}

static void attend_neon(const KVLayer& kv, const KVRange& r, const float* q, int ldq, int hpk, int hkv, int t0, int t1,
                        float* out, int ldo, float* scores) {
  attend_with(dot_neon, axpy_neon, kv, r, q, ldq, hpk, hkv, t0, t1, out, ldo, scores);
}

static const Kernels widen{"neon-widen", nested_linear_widen, f16_linear_neon, attend_neon, quantize_acts,
                           silu_mul_portable};

const Kernels* neon_kernels() {
  static const Kernels sdot{"neon-sdot", nested_linear_sdot, f16_linear_neon, attend_neon, quantize_acts,
                            silu_mul_portable};
  return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? &sdot : &widen;
}

const Kernels* neon_widen_kernels() { return &widen; }

}  // namespace bitnest

#else

namespace bitnest {
const Kernels* neon_kernels() { return nullptr; }
const Kernels* neon_widen_kernels() { return nullptr; }
}  // namespace bitnest

#endif
