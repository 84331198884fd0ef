// NEON kernels (aarch64: the Jetson Orin's Cortex-A78AE cores), chosen at run time. With the dot-product extension
// (ARMv8.2 `sdot`, HWCAP_ASIMDDP) each 4 INT8 x INT8 products go straight into an int32 lane; without it, widening
// multiplies into int16 and pairwise sums into int32. The nested linear (linear_neon.h) reads the interleaved layout
// of native.h: 4 rows x 4 bytes per 16-byte register, the activation dword of 4 columns as a lane of x.
#include <algorithm>
#include <type_traits>

#include "native.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>

#include "attend.h"
#include "linear_tiles.h"

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif

namespace bitnest {
namespace widen {
// acc + the sums of 4 products of each 4-byte row of w with dword `lane` of x, by widening multiplies.
template <int lane>
inline int32x4_t dot4_(int32x4_t acc, int8x16_t w, int8x8_t x) {
  const int8x16_t xr = vreinterpretq_s8_s32(vdupq_lane_s32(vreinterpret_s32_s8(x), lane));
  const int32x4_t s0 = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(xr)));    // rows 0, 1: pair sums
  const int32x4_t s1 = vpaddlq_s16(vmull_high_s8(w, xr));                           // rows 2, 3
  return vaddq_s32(acc, vpaddq_s32(s0, s1));
}
inline int32x4_t dot4(int32x4_t acc, int8x16_t w, int8x8_t x, int lane) {
  return lane ? dot4_<1>(acc, w, x) : dot4_<0>(acc, w, x);
}
#include "linear_neon.h"
}  // namespace widen

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
namespace sdot {
inline int32x4_t dot4(int32x4_t acc, int8x16_t w, int8x8_t x, int lane) {
  return lane ? vdotq_lane_s32(acc, w, x, 1) : vdotq_lane_s32(acc, w, x, 0);
}
#include "linear_neon.h"
}  // namespace sdot
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

static void axpy_fma_neon(float p, const float* x, float* y, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), p));
  for (; i < n; ++i) y[i] += p * x[i];
}

namespace {
struct NeonOps {
  static void dequant(const uint8_t* b, const uint8_t* rf, float s, int D, bool kv8, float* out) {
    dequant_kv_portable(b, rf, s, D, kv8, out);
  }
  static void dots(const float* q, const float* k, int count, int D, float* out) {
    for (int i = 0; i < count; ++i) out[i] = dot_neon(q, k + size_t(i) * D, D);
  }
  static void weighted_sum(float* out, const float* p, const float* v, int count, int D) {
    for (int i = 0; i < count; ++i) axpy_fma_neon(p[i], v + size_t(i) * D, out, D);
  }
  static void softmax(float* sc, int n) { softmax_portable(sc, n); }
};
}  // namespace

static void attend_neon(const KVLayer& kv, const KVRange& r, const AttendWork& u, const float* q, int ldq, int hpk,
                        float* out, int ldo, float* scores, float* kvbuf) {
  attend_unit<NeonOps>(kv, r, u, q, ldq, hpk, out, ldo, scores, kvbuf);
}

static const Kernels widen_set{"neon-widen", widen::linear, f16_linear_neon, attend_neon, quantize_acts,
                               silu_mul_portable, rms_norm_portable, fwht_portable, combine_rows_portable,
                              combine_rows_portable, dot_neon, quantize_kv_vector};
static const Kernels sdot_set{"neon-sdot", sdot::linear, f16_linear_neon, attend_neon, quantize_acts,
                              silu_mul_portable, rms_norm_portable, fwht_portable, combine_rows_portable,
                              combine_rows_portable, dot_neon, quantize_kv_vector};

const Kernels* neon_kernels() { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? &sdot_set : &widen_set; }

const Kernels* neon_widen_kernels() { return &widen_set; }

}  // namespace bitnest

#else

namespace bitnest {
const Kernels* neon_kernels() { return nullptr; }
const Kernels* neon_widen_kernels() { return nullptr; }
}  // namespace bitnest

#endif
