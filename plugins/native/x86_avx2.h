// Shared by the x86 kernel translation units: the AVX2 per-token kernels (avx2_tokens.cpp), which the AVX-VNNI and
// AVX-512 sets reuse, and the AVX2 set's table regardless of this CPU. Plain declarations: each function is
// defined once, in a translation unit built for AVX2.
#pragma once

#include "native.h"

namespace bitnest {

const Kernels& avx2_table();   // the AVX2 kernels (callers check cpu_features() first)

namespace avx2 {
void quantize(const float* x, int ldx, int M, int K, int G, int8_t* xq, int32_t* xsum, float* sx);
void silu_mul(float* g, const float* u, int n);
void rms_norm(const float* x, const uint16_t* w, int n, float eps, float* out);
void fwht(float* x, int pre, int f, int post);
void combine_rows(const float* c, int cb, int ci, int B, int I, const float* in, int ldin, int n, float* out,
                  int ldout);                               // separately rounded: the portable result
void combine_signs(const float* c, int cb, int ci, int B, int I, const float* in, int ldin, int n, float* out,
                   int ldout);                              // coefficients +-1, fused: the portable result
float dot(const float* a, const float* b, int n);
void dequant_kv(const uint8_t* b, const uint8_t* rf, float s, int D, bool kv8, float* out);
void softmax(float* sc, int n);
// out[i] = q . k[i*D:] for i < count, each by the same reduction tree however rows are grouped
void dots(const float* q, const float* k, int count, int D, float* out);
// out[d] += p[i] * v[i*D + d] for i < count in order (fused)
void weighted_sum(float* out, const float* p, const float* v, int count, int D);
void quantize_kv(const float* x, int D, uint8_t* base, uint8_t* refine, uint16_t* scale);
}  // namespace avx2

}  // namespace bitnest
