// The NEON nested linear over the interleaved layout (native.h), included by kernels_neon.cpp once per dot-product
// flavour inside a namespace of its own that defines
//   int32x4_t dot4(int32x4_t acc, int8x16_t w, int8x8_t x, lane)   acc + (4 rows x 4 bytes of w) . (dword `lane` of x)
// No include guard: each inclusion compiles its own copy. A 16-row block is four quarters of 4 rows; each quarter
// pair (8 rows, two int32x4 per token) runs every token of a tile (up to 8: 16 accumulators) over every chunk, so each
// weight is loaded once per tile. The codes are signed: nibble - 8 (the draft's q4), and for the target 16 q4 + qr
// as one int8 where it fits (the symmetric nest), else 16 dot(x, q4) + dot(x, qr): exact dot(x, code), nothing to
// take off; the float work per group is nested_linear_rows' (one product and one sum, in group order).

template <int MT, int MODE>   // MODE 0: draft, 1: target as int8 codes, 2: target from two planes
void octet(const NestedLinear& w, const QActs& a, int nb, int oct, int m0, float* y, int ldy) {
  const int K = w.K, ng = K / w.G, cpg = w.G / kChunk;
  const uint8_t* B = w.base + size_t(nb) * (K / 2) + 32 * oct;
  const uint8_t* F = MODE ? w.refine + size_t(nb) * (K / 2) + 32 * oct : nullptr;
  const uint16_t* S = w.scale + size_t(nb) * ng + 8 * oct;
  const uint16_t* O = w.offset ? w.offset + size_t(nb) * ng + 8 * oct : nullptr;
  const uint8x16_t low = vdupq_n_u8(0x0F);
  const int8x16_t eight = vdupq_n_s8(8);
  float32x4_t acc[MT][2], off[MT][2];
  for (int m = 0; m < MT; ++m)
    for (int q = 0; q < 2; ++q) acc[m][q] = vdupq_n_f32(0.f), off[m][q] = vdupq_n_f32(0.f);
  for (int g = 0; g < ng; ++g) {
    int32x4_t dot[MT][2];
    for (int m = 0; m < MT; ++m) dot[m][0] = dot[m][1] = vdupq_n_s32(0);
    for (int c = g * cpg; c < (g + 1) * cpg; ++c) {
      if (oct == 0) {                      // the second octet reads the same lines from the cache
        prefetch(B + size_t(c) * 64);
        if (MODE) prefetch(F + size_t(c) * 64);
      }
      int8x16_t lo[2], hi[2], rlo[2], rhi[2];
      for (int q = 0; q < 2; ++q) {
        const uint8x16_t vb = vld1q_u8(B + size_t(c) * 64 + 16 * q);
        lo[q] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vb, low)), eight);     // q4 of columns 8c .. 8c+3
        hi[q] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(vb, 4)), eight);     // q4 of columns 8c+4 .. 8c+7
        if (MODE) {
          const uint8x16_t vr = vld1q_u8(F + size_t(c) * 64 + 16 * q);
          rlo[q] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vr, low)), eight);
          rhi[q] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(vr, 4)), eight);
          if (MODE == 1) {                                                     // 16 q4 + qr fits int8 here
            lo[q] = vaddq_s8(vshlq_n_s8(lo[q], 4), rlo[q]);
            hi[q] = vaddq_s8(vshlq_n_s8(hi[q], 4), rhi[q]);
          }
        }
      }
      for (int m = 0; m < MT; ++m) {
        const int8x8_t x = vld1_s8(a.xq + size_t(m0 + m) * K + c * kChunk);
        for (int q = 0; q < 2; ++q) {
          if (MODE == 2) {
            const int32x4_t base = dot4(dot4(vdupq_n_s32(0), lo[q], x, 0), hi[q], x, 1);
            dot[m][q] = vmlaq_n_s32(dot4(dot4(dot[m][q], rlo[q], x, 0), rhi[q], x, 1), base, 16);
          } else {
            dot[m][q] = dot4(dot4(dot[m][q], lo[q], x, 0), hi[q], x, 1);
          }
        }
      }
    }
    for (int q = 0; q < 2; ++q) {
      const float32x4_t step = vmulq_n_f32(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(S + size_t(g) * kRowBlock + 4 * q))),
                                           MODE ? 1.f / 16.f : 1.f);
      const float32x4_t o = O ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(O + size_t(g) * kRowBlock + 4 * q)))
                              : vdupq_n_f32(0.f);
      for (int m = 0; m < MT; ++m) {
        acc[m][q] = vaddq_f32(acc[m][q], vmulq_f32(vcvtq_f32_s32(dot[m][q]), step));
        if (O) off[m][q] = vaddq_f32(off[m][q], vmulq_n_f32(o, float(a.xsum[size_t(m0 + m) * ng + g])));
      }
    }
  }
  for (int q = 0; q < 2; ++q) {
    const float32x4_t bias = w.bias ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(w.bias + nb + 8 * oct + 4 * q)))
                                    : vdupq_n_f32(0.f);
    for (int m = 0; m < MT; ++m) {
      float32x4_t v = vmulq_n_f32(vaddq_f32(acc[m][q], off[m][q]), a.sx[m0 + m]);
      if (w.bias) v = vaddq_f32(v, bias);
      vst1q_f32(y + size_t(m0 + m) * ldy + nb + 8 * oct + 4 * q, v);
    }
  }
}

void linear(const NestedLinear& w, bool target, const QActs& a, float* y, int ldy, int n0, int n1) {
  const int mode = !target ? 0 : w.int8_target ? 1 : 2;
  over_blocks(w, target, a, y, ldy, n0, n1, [&](int nb, int m0, int mt) {
    with_tile(mt, [&](auto MT) {
      for (int oct = 0; oct < 2; ++oct) {
        if (mode == 0) octet<decltype(MT)::value, 0>(w, a, nb, oct, m0, y, ldy);
        else if (mode == 1) octet<decltype(MT)::value, 1>(w, a, nb, oct, m0, y, ldy);
        else octet<decltype(MT)::value, 2>(w, a, nb, oct, m0, y, ldy);
      }
    });
  });
}
