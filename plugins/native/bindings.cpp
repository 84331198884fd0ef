// torch.library registration of the native CPU plugins under the contract's op names (plugins/contracts.py):
// bitnest::dual_plane_linear and bitnest::nested_kv_attention with the reference's arguments and semantics,
// bitnest::quantize_kv, and the whole decoder step as the class bitnest.DecoderStep (one call per pass).
#include <ATen/ATen.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstring>
#include <string>
#include <vector>

#include "step.h"

namespace bitnest {
namespace {

const Kernels* kernels_or_throw(const std::string& isa) {
  const Kernels* k = select_kernels(isa.c_str());
  TORCH_CHECK(k != nullptr, "native kernels '", isa, "' do not run on this CPU (", isa_names(), " exist; this CPU runs ",
              runnable_isas(), ")");
  return k;
}

const uint16_t* half_ptr(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::Half>()); }

void check(const at::Tensor& t, at::ScalarType dtype, const std::string& name) {
  TORCH_CHECK(t.defined() && t.scalar_type() == dtype && t.is_contiguous() && t.device().is_cpu(), name,
              " must be a contiguous CPU tensor of ", c10::toString(dtype), ", got ",
              t.defined() ? c10::toString(t.scalar_type()) : "nothing");
}

// Canonical planes (signed nibbles, row-major) -> this backend's layout (native.h): offset-binary nibbles, rows
// interleaved in blocks, scales and offsets group-major per block; in place.
void relayout_plane_(at::Tensor& plane, const std::string& name) {
  check(plane, at::kByte, name);
  TORCH_CHECK(plane.dim() == 2, name, " must be [N, K/2], got ", plane.sizes());
  plane.bitwise_xor_(0x88);
  interleave_plane(plane.data_ptr<uint8_t>(), plane.size(0), plane.size(1) * 2);
}

void relayout_groups_(at::Tensor& values, const std::string& name) {
  check(values, at::kHalf, name);
  TORCH_CHECK(values.dim() == 2, name, " must be [N, K/G], got ", values.sizes());
  interleave_groups(reinterpret_cast<uint16_t*>(values.data_ptr<at::Half>()), values.size(0), values.size(1));
}

// A nested linear over planes already in this backend's layout.
NestedLinear linear_of(const at::Tensor& base, const at::Tensor& refine, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& offset, const std::string& name) {
  check(base, at::kByte, name + ".base");
  check(scale, at::kHalf, name + ".scale");
  NestedLinear w;
  w.N = base.size(0), w.K = base.size(1) * 2, w.G = w.K / scale.size(1);
  TORCH_CHECK(scale.size(0) == w.N && w.K % scale.size(1) == 0, name, ": scale ", scale.sizes(), " does not fit ",
              base.sizes());
  w.base = base.data_ptr<uint8_t>(), w.scale = half_ptr(scale);
  if (refine.defined() && refine.numel()) check(refine, at::kByte, name + ".refine"), w.refine = refine.data_ptr<uint8_t>();
  if (offset && offset->defined() && offset->numel()) check(*offset, at::kHalf, name + ".offset"), w.offset = half_ptr(*offset);
  w.int8_target = w.refine && !w.offset && target_fits_int8(w.base, w.refine, size_t(w.N) * w.K / 2);
  return w;
}

at::Tensor dual_plane_linear(const at::Tensor& x, const at::Tensor& base, const c10::optional<at::Tensor>& refine,
                             const at::Tensor& scale, const std::string& view, const c10::optional<at::Tensor>& offset,
                             const std::string& isa) {
  TORCH_CHECK(view == "draft" || view == "target", "unknown weight view '", view, "': use draft or target");
  const bool target = view == "target";
  TORCH_CHECK(!target || (refine && refine->defined()), "the target view needs the refinement plane");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor b = base.contiguous().clone(), r = target ? refine->contiguous().clone() : at::Tensor();   // re-laid copies
  at::Tensor sc = scale.contiguous().clone(), off;
  relayout_plane_(b, "base");
  if (target) relayout_plane_(r, "refine");
  relayout_groups_(sc, "scale");
  if (offset && offset->defined() && offset->numel()) off = offset->contiguous().clone(), relayout_groups_(off, "offset");
  NestedLinear w = linear_of(b, r, sc, off.defined() ? c10::optional<at::Tensor>(off) : c10::nullopt, "dual_plane_linear");
  TORCH_CHECK(xf.dim() == 2 && xf.size(1) == w.K, "x ", xf.sizes(), " does not fit planes of K=", w.K);
  const std::string why = unsupported_linear(w, "dual_plane_linear");
  TORCH_CHECK(why.empty(), why);
  const int M = xf.size(0), ng = w.K / w.G;
  std::vector<int8_t> xq(size_t(M) * w.K);
  std::vector<int32_t> xsum(size_t(M) * ng);
  std::vector<float> sx(M);
  quantize_acts(xf.data_ptr<float>(), w.K, M, w.K, w.G, xq.data(), xsum.data(), sx.data());
  at::Tensor y = at::empty({M, w.N}, at::kFloat);
  kernels_or_throw(isa)->nested_linear(w, target, QActs{xq.data(), xsum.data(), sx.data(), M, w.K, w.G},
                                       y.data_ptr<float>(), w.N, 0, w.N);
  return y;
}

at::Tensor nested_kv_attention(const at::Tensor& q, const at::Tensor& base, const at::Tensor& refine,
                               const at::Tensor& scale, int64_t main_len, int64_t kv8_from,
                               const c10::optional<at::Tensor>& sbase, const c10::optional<at::Tensor>& srefine,
                               const c10::optional<at::Tensor>& sscale, int64_t scratch_len, int64_t window,
                               const std::string& isa) {
  check(base, at::kByte, "base"), check(refine, at::kByte, "refine"), check(scale, at::kHalf, "scale");
  TORCH_CHECK(q.dim() == 3 && base.dim() == 4 && base.size(0) == 2, "q [Hq, T, D] and planes [2, Hkv, C, D/2] expected");
  const int Hq = q.size(0), T = q.size(1), D = q.size(2), Hkv = base.size(1);
  TORCH_CHECK(base.size(3) * 2 == D && Hq % Hkv == 0 && D <= 512, "q ", q.sizes(), " does not fit planes ", base.sizes());
  const int S = main_len + scratch_len;
  TORCH_CHECK(T >= 1 && T <= S && main_len <= base.size(2), T, " queries over ", S, " positions do not fit the planes");
  KVLayer kv;
  kv.base = base.data_ptr<uint8_t>(), kv.refine = refine.data_ptr<uint8_t>();
  kv.scale = const_cast<uint16_t*>(half_ptr(scale));
  kv.C = base.size(2), kv.Hkv = Hkv, kv.D = D, kv.R = refine.size(2);
  TORCH_CHECK(refine.dim() == 4 && refine.size(2) >= 1 && refine.size(2) <= kv.C && window >= 0,
              "the refinement ring [2, Hkv, R, D/2] needs 1 <= R <= capacity and window >= 0");
  if (scratch_len) {
    TORCH_CHECK(sbase && srefine && sscale, "scratch_len > 0 needs the scratch planes");
    check(*sbase, at::kByte, "scratch base"), check(*srefine, at::kByte, "scratch refine"), check(*sscale, at::kHalf, "scratch scale");
    TORCH_CHECK(scratch_len <= sbase->size(2), "scratch_len exceeds the scratch planes");
    kv.sbase = sbase->data_ptr<uint8_t>(), kv.srefine = srefine->data_ptr<uint8_t>();
    kv.sscale = const_cast<uint16_t*>(half_ptr(*sscale)), kv.S = sbase->size(2);
  }
  const at::Tensor qt = q.to(at::kFloat).transpose(0, 1).contiguous();               // [T, Hq, D]
  at::Tensor out = at::empty({T, Hq, D}, at::kFloat);
  std::vector<float> kvbuf(size_t(kPosBlock) * D);
  std::vector<float> scores(size_t(std::min<int64_t>(T, kQueryTile)) * (Hq / Hkv) * S);
  const KVRange r{S - T, int(main_len), int(kv8_from), scratch_len > 0, {}, int(window)};
  const Kernels* k = kernels_or_throw(isa);
  for (int h = 0; h < Hkv; ++h)
    k->attend(kv, r, AttendWork{h, 0, Hq / Hkv, 0, T}, qt.data_ptr<float>(), Hq * D, Hq / Hkv, out.data_ptr<float>(),
              Hq * D, scores.data(), kvbuf.data());
  return out.transpose(0, 1).contiguous();                                             // [Hq, T, D]
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_kv(const at::Tensor& x, const std::string& isa) {
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int D = xf.size(-1);
  TORCH_CHECK(D % 2 == 0, "KV vectors need an even length, got ", D);
  const int64_t n = xf.numel() / D;
  auto lead = xf.sizes().vec();
  lead.pop_back();
  auto plane_shape = lead;
  plane_shape.push_back(D / 2);
  at::Tensor b = at::empty(plane_shape, at::kByte), r = at::empty(plane_shape, at::kByte), s = at::empty(lead, at::kHalf);
  const Kernels* k = kernels_or_throw(isa);
  for (int64_t i = 0; i < n; ++i)
    k->quantize_kv(xf.data_ptr<float>() + i * D, D, b.data_ptr<uint8_t>() + i * (D / 2),
                   r.data_ptr<uint8_t>() + i * (D / 2), reinterpret_cast<uint16_t*>(s.data_ptr<at::Half>()) + i);
  return {b, r, s};
}

std::string best_isa() { return select_kernels("")->name; }
std::string runnable() { return runnable_isas(); }

// The decoder step over tensors the caller keeps in `tensors` (names as the checkpoint's, plus rope.cos/sin,
// rotation.r4.I factors, kv.* and scratch.* cache planes); the holder keeps them alive.
struct StepHolder : torch::CustomClassHolder {
  c10::Dict<std::string, at::Tensor> tensors;
  std::unique_ptr<DecoderStep> step;
  int64_t vocab = 0;
  bool target_planes = true;   // every block linear holds its refinement plane (false: --weights base)

  StepHolder(c10::Dict<std::string, at::Tensor> t, c10::Dict<std::string, int64_t> n, double eps, std::string isa)
      : tensors(std::move(t)) {
    auto get = [&](const std::string& k) -> at::Tensor {
      TORCH_CHECK(tensors.contains(k), "the native step needs tensor ", k);
      return tensors.at(k);
    };
    auto opt = [&](const std::string& k) -> c10::optional<at::Tensor> {
      return tensors.contains(k) ? c10::optional<at::Tensor>(tensors.at(k)) : c10::nullopt;
    };
    auto num = [&](const std::string& k) -> int { TORCH_CHECK(n.contains(k), "the native step needs ", k); return n.at(k); };
    // the canonical planes, re-laid in place (the holder owns them); a checkpoint loaded with its base planes only
    // (--weights base) has no refinement plane: the step then runs the draft view alone (`forward` refuses the target)
    auto nested = [&](const std::string& name) {
      at::Tensor b = get(name + ".base"), sc = get(name + ".scale"), r;
      relayout_plane_(b, name + ".base"), relayout_groups_(sc, name + ".scale");
      if (auto rr = opt(name + ".refine")) r = *rr, relayout_plane_(r, name + ".refine");
      else target_planes = false;
      if (auto o = opt(name + ".offset")) relayout_groups_(*o, name + ".offset");
      NestedLinear w = linear_of(b, r, sc, opt(name + ".offset"), name);
      if (auto b = opt(name + ".bias")) check(*b, at::kHalf, name + ".bias"), w.bias = half_ptr(*b);
      return w;
    };
    StepDims d;
    d.layers = num("layers"), d.hidden = num("hidden"), d.intermediate = num("intermediate"), d.heads = num("heads");
    d.kv_heads = num("kv_heads"), d.head_dim = num("head_dim"), d.vocab = num("vocab"), d.eps = float(eps);
    d.max_tokens = num("max_tokens"), d.threads = num("threads");
    d.draft_head = DraftHead(n.contains("draft_head") ? n.at("draft_head") : 0);
    d.shortlist = n.contains("shortlist") ? int(n.at("shortlist")) : 0;
    d.kv_window = n.contains("kv_window") ? int(n.at("kv_window")) : 0;
    d.draft_vocab = n.contains("draft_vocab") ? int(n.at("draft_vocab")) : 0;
    TORCH_CHECK(d.kv_window >= 0, "kv_window must be >= 0");
    vocab = d.vocab;
    StepWeights w;
    for (int l = 0; l < d.layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      LayerWeights L;
      L.q = nested(p + "self_attn.q_proj"), L.k = nested(p + "self_attn.k_proj"), L.v = nested(p + "self_attn.v_proj");
      L.o = nested(p + "self_attn.o_proj"), L.gate = nested(p + "mlp.gate_proj"), L.up = nested(p + "mlp.up_proj");
      L.down = nested(p + "mlp.down_proj");
      check(get(p + "input_layernorm.weight"), at::kHalf, p + "input_layernorm.weight");
      check(get(p + "post_attention_layernorm.weight"), at::kHalf, p + "post_attention_layernorm.weight");
      L.input_norm = half_ptr(get(p + "input_layernorm.weight"));
      L.post_norm = half_ptr(get(p + "post_attention_layernorm.weight"));
      w.layers.push_back(L);
    }
    if (tensors.contains("model.embed_tokens.weight")) {
      check(get("model.embed_tokens.weight"), at::kHalf, "model.embed_tokens.weight");
      w.embed = half_ptr(get("model.embed_tokens.weight"));
    } else {
      TORCH_CHECK(tensors.contains("lm_head.base"), "the native step needs model.embed_tokens.weight or a nested head");
    }
    w.final_norm = half_ptr(get("model.norm.weight"));
    if (tensors.contains("lm_head.base")) {
      w.head = nested("lm_head");
    } else {
      check(get("lm_head.weight"), at::kHalf, "lm_head.weight");
      w.head_f16 = half_ptr(get("lm_head.weight"));
    }
    if (auto r1 = opt("rotation.r1")) check(*r1, at::kFloat, "rotation.r1"), w.r1 = r1->data_ptr<float>();
    for (int i = 0; tensors.contains("rotation.r4." + std::to_string(i)); ++i) {
      const at::Tensor& f = tensors.at("rotation.r4." + std::to_string(i));
      check(f, at::kFloat, "rotation.r4");
      w.r4_orders.push_back(f.size(0)), w.r4_factors.push_back(f.data_ptr<float>());
    }
    check(get("rope.cos"), at::kFloat, "rope.cos"), check(get("rope.sin"), at::kFloat, "rope.sin");
    w.rope_cos = get("rope.cos").data_ptr<float>(), w.rope_sin = get("rope.sin").data_ptr<float>();
    w.rope_positions = get("rope.cos").size(0);
    std::vector<KVLayer> kv;
    const at::Tensor kb = get("kv.base"), kr = get("kv.refine"), ks = get("kv.scale");
    const at::Tensor sb = get("scratch.base"), sr = get("scratch.refine"), ss = get("scratch.scale");
    for (const auto* t : {&kb, &kr, &sb, &sr}) check(*t, at::kByte, "KV planes");
    TORCH_CHECK(kr.size(3) >= 1 && kr.size(3) <= kb.size(3), "the refinement ring must hold 1 to capacity slots");
    check(ks, at::kHalf, "KV scales"), check(ss, at::kHalf, "scratch scales");
    for (int l = 0; l < d.layers; ++l) {
      KVLayer L;
      L.base = kb[l].data_ptr<uint8_t>(), L.refine = kr[l].data_ptr<uint8_t>();
      L.scale = reinterpret_cast<uint16_t*>(ks[l].data_ptr<at::Half>());
      L.sbase = sb[l].data_ptr<uint8_t>(), L.srefine = sr[l].data_ptr<uint8_t>();
      L.sscale = reinterpret_cast<uint16_t*>(ss[l].data_ptr<at::Half>());
      L.C = kb.size(3), L.S = sb.size(3), L.Hkv = d.kv_heads, L.D = d.head_dim, L.R = kr.size(3);
      kv.push_back(L);
    }
    TORCH_CHECK(kv.empty() || kv[0].C == w.rope_positions, "RoPE tables and KV capacity differ");
    try {
      step = std::make_unique<DecoderStep>(d, w, std::move(kv), kernels_or_throw(isa));
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK(false, "unsupported by the native kernels: ", e.what());
    }
  }

  at::Tensor forward(const at::Tensor& ids, bool target, int64_t start, int64_t committed, bool draft,
                     int64_t kv8_from, bool last_only) {
    check(ids, at::kLong, "ids");
    TORCH_CHECK(!target || target_planes, "the target view needs the refinement planes, and this step holds the base "
                "planes only (--weights base)");
    const int M = ids.numel();
    at::Tensor logits = at::empty({last_only ? 1 : M, vocab}, at::kFloat);
    try {
      step->forward(ids.data_ptr<int64_t>(), M, target, start, committed, draft, kv8_from, last_only,
                    logits.data_ptr<float>());
    } catch (const std::exception& e) {
      TORCH_CHECK(false, e.what());
    }
    return logits;
  }

  std::string isa() const { return step->kernels().name; }
  int64_t workspace_bytes() const { return int64_t(step->workspace_bytes()); }
};

}  // namespace
}  // namespace bitnest

TORCH_LIBRARY(bitnest, m) {
  m.def("dual_plane_linear(Tensor x, Tensor base, Tensor? refine, Tensor scale, str view, Tensor? offset=None, "
        "str isa='') -> Tensor", &bitnest::dual_plane_linear);
  m.def("nested_kv_attention(Tensor q, Tensor base, Tensor refine, Tensor scale, int main_len, int kv8_from, "
        "Tensor? scratch_base=None, Tensor? scratch_refine=None, Tensor? scratch_scale=None, int scratch_len=0, "
        "int window=0, str isa='') -> Tensor", &bitnest::nested_kv_attention);
  m.def("quantize_kv(Tensor x, str isa='') -> (Tensor, Tensor, Tensor)", &bitnest::quantize_kv);
  m.def("isa() -> str", &bitnest::best_isa);
  m.def("runnable_isas() -> str", &bitnest::runnable);
  m.class_<bitnest::StepHolder>("DecoderStep")
      .def(torch::init<c10::Dict<std::string, at::Tensor>, c10::Dict<std::string, int64_t>, double, std::string>())
      .def("forward", &bitnest::StepHolder::forward)
      .def("isa", &bitnest::StepHolder::isa)
      .def("workspace_bytes", &bitnest::StepHolder::workspace_bytes);
}
