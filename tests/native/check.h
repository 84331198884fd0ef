// What the two parts of the standalone kernel check share (check_kernels.cpp: the kernels; check_step.cpp: the
// whole step): the failure count, error measures and random nested linears with canonical and laid-out planes.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "native.h"
#include "oracle.h"

namespace check {

using namespace bitnest;

inline int& failures() {
  static int n = 0;
  return n;
}

inline void expect(bool ok, const char* what, double value = 0) {
  if (!ok) {
    std::printf("FAIL %s: %g\n", what, value);
    ++failures();
  }
}

// ||a - b|| / ||b|| in double
template <class A, class B>
double rel(const std::vector<A>& a, const std::vector<B>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i])), den += double(b[i]) * b[i];
  return std::sqrt(num / (den + 1e-300));
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// A nested linear with canonical planes (signed nibbles, row-major) and the copy re-laid for the kernels.
struct Linear {
  int N, K, G;
  std::vector<uint8_t> base, refine, lbase, lrefine;   // canonical, laid out
  std::vector<uint16_t> scale, offset, lscale, loffset, bias;
  bool int8 = false;
  int code4(int n, int k) const { return int8_t(uint8_t(base[size_t(n) * K / 2 + k / 2] >> (4 * (k & 1))) << 4) >> 4; }
  NestedLinear view() const {
    NestedLinear w;
    w.base = lbase.data(), w.refine = lrefine.data(), w.scale = lscale.data(), w.N = N, w.K = K, w.G = G;
    w.offset = offset.empty() ? nullptr : loffset.data(), w.bias = bias.empty() ? nullptr : bias.data();
    w.int8_target = int8;
    return w;
  }
  oracle::Planes planes() const {   // the canonical planes, for the oracle
    return {base.data(), refine.data(), scale.data(), offset.empty() ? nullptr : offset.data(),
            bias.empty() ? nullptr : bias.data(), N, K, G};
  }
};

// Random planes; `symmetric`: refinement codes >= 0 where the base code is -8 (the symmetric nest), so the
// target's 8-bit code fits int8.
inline Linear random_linear(std::mt19937& rng, int n, int k, int g, bool symmetric, bool with_offset = false,
                            bool with_bias = false) {
  Linear l{n, k, g};
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(0.001f, 0.02f), off(-0.05f, 0.05f);
  l.base.resize(size_t(n) * k / 2), l.refine.resize(l.base.size()), l.scale.resize(size_t(n) * k / g);
  for (auto& b : l.base) b = uint8_t(byte(rng));
  for (auto& b : l.refine) b = uint8_t(byte(rng));
  for (auto& s : l.scale) s = f32_to_f16(sc(rng));
  if (with_offset) for (size_t i = 0; i < l.scale.size(); ++i) l.offset.push_back(f32_to_f16(off(rng)));
  if (with_bias) for (int i = 0; i < n; ++i) l.bias.push_back(f32_to_f16(off(rng)));
  if (symmetric)
    for (size_t i = 0; i < l.base.size(); ++i) {      // canonical nibble 8 is -8
      if ((l.base[i] & 15) == 8) l.refine[i] &= 0xF7;
      if ((l.base[i] >> 4) == 8) l.refine[i] &= 0x7F;
    }
  l.lbase = l.base, l.lrefine = l.refine, l.lscale = l.scale, l.loffset = l.offset;
  for (auto* p : {&l.lbase, &l.lrefine})
    for (auto& b : *p) b ^= 0x88;
  l.int8 = symmetric && !with_offset && target_fits_int8(l.lbase.data(), l.lrefine.data(), l.lbase.size());
  interleave_plane(l.lbase.data(), n, k), interleave_plane(l.lrefine.data(), n, k);
  interleave_groups(l.lscale.data(), n, k / g);
  if (with_offset) interleave_groups(l.loffset.data(), n, k / g);
  return l;
}

void check_step(const Kernels& k);   // check_step.cpp

}  // namespace check
