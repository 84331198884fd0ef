"""Memory planner (docs/memory.md): the bytes a run allocates (weights by format, KV per position, draft
scratch, the refinement ring of elastic KV, the largest pass's workspace) on a device profile, the maximum context
that fits, and the arithmetic behind it."""

from dataclasses import dataclass, field

from edge.engine import MAX_PROPOSALS, draft_slots
from edge.engine.kv_cache import ElasticKV, KVRead
from edge.errors import BitNestError
from edge.memory.devices import DeviceProfile, MiB
from edge.memory.synthetic import exported_shapes
from edge.memory.workspace import DryRun, fused_workspace, split_prefill_tail, steps_at_end
from edge.model.arch import ModelConfig
from edge.model.checkpoint import HEAD, Checkpoint, draft_reads_refine
from plugins.kernels.tiling import WARP_ROWS

# Backends whose passes run as torch ops, so a dry run on meta tensors counts their workspace exactly.
TRACED_BACKENDS = ("cpu", "torch")


@dataclass(frozen=True)
class RunConfig:
    """How a model is run: weight format, KV format, decoding, and the KV view drafts read at long context."""

    name: str
    weights: str            # fp16 | w8a8 | nested | base (the nested checkpoint's base planes only)
    kv: str                 # fp16 | nested
    speculative: bool
    draft_kv: str = "kv8"   # kv8 | kv4
    about: str = ""
    elastic: bool = False   # elastic KV: base planes for every position, refinement for a ring of window + G slots


CONFIGS = {
    "fp16-ar": RunConfig("fp16-ar", "fp16", "fp16", False, about="FP16 weights, FP16 KV, autoregressive"),
    "w8a8-ar": RunConfig("w8a8-ar", "w8a8", "fp16", False,
                         about="INT8 weights (per-channel fp16 scales), INT8 activations, FP16 KV (the paper's W8A8 AR)"),
    "bitnest": RunConfig("bitnest", "nested", "nested", True, "kv4",
                         about="nested W4/W8 planes, nested KV4/KV8, speculative; drafts read KV4 at long context"),
    "bitnest-kv8-draft": RunConfig("bitnest-kv8-draft", "nested", "nested", True, "kv8",
                                   about="as bitnest, drafts read KV8 at every context"),
    "bitnest-elastic": RunConfig("bitnest-elastic", "nested", "nested", True, "kv4", elastic=True,
                                 about="as bitnest, but every query reads KV8 for its last --kv-window positions "
                                       "only: KV4 base planes for the whole context, refinement for a ring of "
                                       "window + widest pass slots (elastic KV; runs on the native, cpu and torch "
                                       "backends)"),
    "bitnest-base": RunConfig("bitnest-base", "base", "nested", False, "kv4",
                              about="base planes only (--weights base: the 4-bit model, draft policy), nested KV; "
                                    "its passes read KV4 at long context"),
}
NESTED_FORMATS = ("nested", "base")     # weights read from a nested checkpoint
DEFAULT_KV_WINDOW = 256    # elastic KV's window, as Recent-N's default (edge.decode.config.DraftKVPolicy.recent)


@dataclass(frozen=True)
class Workload:
    gamma: int = 4
    prefill_chunk: int = 256
    kv_window: int = DEFAULT_KV_WINDOW      # elastic KV's window (configs with `elastic` only)

    def __post_init__(self):
        if not 1 <= self.gamma <= MAX_PROPOSALS or self.prefill_chunk < 1 or self.kv_window < 1:
            raise BitNestError(f"gamma must be in [1, {MAX_PROPOSALS}], the prefill chunk and the KV window at least 1 "
                               "token")


def widest_pass(backend: str, prefill_chunk: int, scratch: int) -> int:
    """Tokens of the widest pass that writes KV (a prefill chunk or a verification over `scratch` draft slots) as
    the engine of `backend` runs it: elastic KV's ring holds window + this many slots (Engine.check_elastic)."""
    if backend == "native":
        from edge.backends.native import workspace_rows
        return workspace_rows(prefill_chunk, scratch)
    return max(prefill_chunk, scratch + 1)


def refine_bytes_per_position(cfg: ModelConfig) -> int:
    """The refinement plane's bytes per position (D/2 per vector): nested KV minus what a KV4 read touches."""
    return kv_bytes_per_position(cfg, "nested") - kv_bytes_per_position(cfg, "kv4")


def nested_weight_bytes(ckpt: Checkpoint, layout: str, weights: str = "nested") -> dict[str, int]:
    """Weight bytes of a nested checkpoint as a backend holds them. `canonical` (torch backend, and a TensorRT
    engine: its graph tiles only linears of whole 32-row blocks, the same bytes): the planes, float16 scales (and
    offsets) as stored. `tiled` (the `triton` backend,
    plugins.kernels.tiling): the same with N rounded up to a block of 32 rows. `cpu`: the planes re-laid at the same size, scales
    and zeros as one bfloat16 [K/G, N, 2] tensor per plane set (shared by both planes unless an offset exists).
    `weights` `base`: the base planes only, and the refinement planes the draft itself reads (a nested head's, where
    edge.model.checkpoint.draft_reads_refine says so), as a `--weights base` load holds them."""
    out = {"linear_planes": 0, "linear_scales": 0, "embedding": 0, "head": 0, "norms_biases": 0, "rotation": 0}
    for name, spec in ckpt.linears.items():
        n, k = spec.shape
        if layout == "tiled":
            n = -(-n // WARP_ROWS) * WARP_ROWS
        groups = n * (k // spec.group_size)
        key = "head" if name == HEAD else "linear_planes"
        both = weights == "nested" or draft_reads_refine(ckpt.manifest, name)
        out[key] += n * k // (1 if both else 2)                            # base (+ refine), K/2 bytes each
        if layout == "cpu":
            scales = 4 * groups * (2 if spec.offset and both else 1)
        else:
            scales = 2 * groups * (2 if spec.offset else 1)
        out["head" if name == HEAD else "linear_scales"] += scales
    for name, t in ckpt.tensors.items():
        b = t.numel() * t.element_size()
        if name.endswith((".base", ".refine", ".scale", ".offset")):
            continue
        if name == "model.embed_tokens.weight":
            out["embedding"] += b
        elif name == "lm_head.weight":
            out["head"] += b
        elif name == "rotation.r1":
            out["rotation"] += b
        else:
            out["norms_biases"] += b
    return out


def dense_weight_bytes(cfg: ModelConfig, fmt: str) -> dict[str, int]:
    """Weight bytes of the FP16 and W8A8 baselines: linears at 2 bytes (fp16) or 1 byte plus a float16
    scale per output channel (w8a8); embedding and head float16 (the head tied to the embedding if so)."""
    lin = sum(n * k for n, k in cfg.linear_shapes().values()) * cfg.num_layers
    rows = sum(n for n, _ in cfg.linear_shapes().values()) * cfg.num_layers
    emb = cfg.vocab_size * cfg.hidden_size * 2
    bias = 2 * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim * cfg.num_layers if cfg.attention_bias else 0
    return {"linear_planes": lin * (2 if fmt == "fp16" else 1), "linear_scales": 0 if fmt == "fp16" else 2 * rows,
            "embedding": emb, "head": 0 if cfg.tie_word_embeddings else emb,
            "norms_biases": 2 * cfg.hidden_size * (2 * cfg.num_layers + 1) + bias, "rotation": 0}


def kv_bytes_per_position(cfg: ModelConfig, kv: str) -> int:
    """fp16: K and V vectors at 2 bytes per value. nested (docs/contracts.md, KV cache): two packed 4-bit planes (D/2 bytes
    each) and one float16 scale per (layer, K/V, KV head). kv4: what a KV4 read touches of the nested
    cache (the base plane and the scale)."""
    per_vector = {"fp16": cfg.head_dim * 2, "nested": cfg.head_dim + 2, "kv4": cfg.head_dim // 2 + 2}[kv]
    return cfg.num_layers * 2 * cfg.num_kv_heads * per_vector


def draft_read(cfg: ModelConfig, config: RunConfig) -> int | None:
    """KV bytes a draft pass reads per cached position at long context (storage is the same either way:
    verification reads KV8); a base-planes run's passes are all draft passes."""
    drafts = config.speculative or config.weights == "base"
    return kv_bytes_per_position(cfg, "nested" if config.draft_kv == "kv8" else "kv4") if drafts else None


@dataclass
class MemoryPlan:
    """What a run allocates at `context` positions and the largest context that fits the device."""

    model: str
    config: RunConfig
    device: DeviceProfile
    workload: Workload
    backend: str                   # who runs it: "gpu-kernels" (formula) or a torch backend here (traced)
    weights: dict[str, int]
    kv_per_position: int
    scratch_slots: int
    max_context: int
    limited_by: str
    workspace: dict[str, int] = field(default_factory=dict)   # per step, at max_context
    draft_read_per_position: int | None = None                # KV bytes a draft pass reads per position
    workspace_growth: float = 0.0                             # workspace bytes per extra position (a dry run:
    #                                                           the secant; the GPU formula: near the answer)
    memory_max_context: int = 0                               # the largest context memory allows (before the cap)
    ring_slots: int = 0                                       # elastic KV: refinement ring slots (window + G)
    refine_per_position: int = 0                              # elastic KV: ring bytes per slot
    kv_window: int = 0                                        # elastic KV: the window
    positions_cap: int = 0                                    # the model's positions (max_position_embeddings)

    @property
    def ring_bytes(self) -> int:
        return self.ring_slots * self.refine_per_position

    @property
    def weight_bytes(self) -> int:
        return sum(self.weights.values())

    @property
    def scratch_bytes(self) -> int:
        return self.scratch_slots * (self.kv_per_position + self.refine_per_position)   # draft slots keep both planes

    @property
    def workspace_bytes(self) -> int:
        return max(self.workspace.values(), default=0)

    def kv_bytes(self, context: int) -> int:
        return context * self.kv_per_position

    def total_bytes(self, context: int | None = None) -> int:
        """Planned bytes at `context` (default the maximum); workspace as planned at the maximum."""
        c = self.max_context if context is None else context
        return self.weight_bytes + self.kv_bytes(c) + self.scratch_bytes + self.ring_bytes + self.workspace_bytes

    def arithmetic(self) -> list[str]:
        d, w, mb = self.device, self.weights, lambda b: f"{b / MiB:,.1f} MiB"
        lines = [f"usable = total {mb(d.total_bytes)} - OS {mb(d.os_reserve_bytes)} - context {mb(d.context_reserve_bytes)}"
                 f" = {mb(d.usable_bytes)}",
                 "weights = " + " + ".join(f"{k} {mb(v)}" for k, v in w.items() if v) + f" = {mb(self.weight_bytes)}",
                 f"KV per position = {self.kv_per_position:,} B ({'kv4: base plane + scale' if self.ring_slots else self.config.kv})",
                 f"draft scratch = {self.scratch_slots} slots x {self.kv_per_position + self.refine_per_position:,} B"
                 f" = {mb(self.scratch_bytes)}",
                 "workspace = max(" + ", ".join(f"{k} {mb(v)}" for k, v in self.workspace.items())
                 + f") = {mb(self.workspace_bytes)} ({self.backend})"]
        fixed, plus, minus = self.scratch_bytes + self.ring_bytes, mb(self.scratch_bytes), mb(self.scratch_bytes)
        if self.ring_slots:
            lines.append(f"refinement ring = (window {self.kv_window:,} + widest pass "
                         f"{self.ring_slots - self.kv_window:,}) slots x {self.refine_per_position:,} B = "
                         f"{mb(self.ring_bytes)}")
            plus, minus = f"{plus} + {mb(self.ring_bytes)}", f"{minus} - {mb(self.ring_bytes)}"
        free = self.device.usable_bytes - self.weight_bytes - fixed - self.workspace_bytes
        cap = f", capped at {self.max_context:,} by the model's positions" if self.limited_by == "positions" else ""
        # a workspace that grows with the context (dry runs; the GPU kernels' flash partials): no closed form
        if self.workspace_growth:
            lines.append(f"max context = largest C with {mb(self.weight_bytes)} + {plus} + C x "
                         f"{self.kv_per_position:,} B + workspace(C) <= {mb(d.usable_bytes)}, the workspace growing "
                         f"~{self.workspace_growth:,.0f} B per position: C = {self.memory_max_context:,}"
                         f" (planned {mb(self.total_bytes())}){cap}")
        else:
            lines.append(f"max context = floor(({mb(d.usable_bytes)} - {mb(self.weight_bytes)} - {minus}"
                         f" - {mb(self.workspace_bytes)}) / {self.kv_per_position:,} B) = "
                         f"{max(0, free // self.kv_per_position):,}{cap}")
        return lines

    def to_dict(self) -> dict:
        c = self.max_context
        elastic = {"kv_window": self.kv_window, "ring_slots": self.ring_slots, "ring_bytes": self.ring_bytes,
                   "refine_bytes_per_position": self.refine_per_position} if self.ring_slots else {}
        return {"max_context": c, "limited_by": self.limited_by, "memory_max_context": self.memory_max_context,
                "positions_cap": self.positions_cap, **elastic, "about": self.config.about,
                "backend": self.backend, "weight_bytes": self.weight_bytes, "weights": self.weights,
                "kv_bytes_per_position": self.kv_per_position, "kv_bytes": self.kv_bytes(c),
                "draft_reads_kv_bytes_per_position": self.draft_read_per_position,
                "scratch_slots": self.scratch_slots, "scratch_bytes": self.scratch_bytes,
                "workspace_bytes": self.workspace_bytes, "workspace": self.workspace,
                "planned_bytes": self.total_bytes(), "usable_bytes": self.device.usable_bytes,
                "arithmetic": self.arithmetic()}


LOCAL = 64    # positions between the two contexts whose workspaces give the line near an answer
GROWTH_SPAN = 1024   # positions below a GPU plan's answer over which its reported workspace growth is measured


def _largest(lo: int, hi: int, ok) -> int:
    """Largest c in [lo, hi] with ok(c), for ok true up to some point and false after it (ok(lo) holds)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def plan(model: str, cfg: ModelConfig, config: RunConfig, device: DeviceProfile, workload: Workload = Workload(),
         ckpt: Checkpoint | None = None, backend: str | None = None, scratch: int | None = None) -> MemoryPlan:
    """The plan and maximum context of `config` for model `cfg` (a loaded checkpoint's exact tensors where
    given) on `device`. `backend`: a torch backend of this runtime ("cpu", "torch") is dry-run on meta
    tensors; `native` is its step's own allocation formula (edge.backends.native.workspace_bytes); None means the device's own: "gpu-kernels" on a GPU, "cpu" on a CPU; baselines (fp16-ar,
    w8a8-ar), which this runtime does not run, always use the GPU kernels' formula."""
    if config.weights not in NESTED_FORMATS:
        backend = "gpu-kernels"
    elif backend is None:
        backend = "gpu-kernels" if device.compute == "gpu" else "cpu"
    elif backend not in TRACED_BACKENDS + ("native",):   # kernels this runtime cannot dry-run here
        backend = "gpu-kernels"
    if config.weights in NESTED_FORMATS:
        layout = {"cpu": "cpu", "triton": "tiled"}.get(backend, "canonical")
        weights = nested_weight_bytes(ckpt if ckpt is not None else exported_shapes(cfg, "meta"), layout,
                                      config.weights)
    else:
        weights = dense_weight_bytes(cfg, config.weights)
    slots = (scratch if scratch is not None else workload.gamma) if config.speculative else 0
    per_pos, refine, ring, elastic = kv_bytes_per_position(cfg, config.kv), 0, 0, None
    if config.elastic:    # base planes and scales per position; the refinement in a ring of window + G slots
        refine = refine_bytes_per_position(cfg)
        per_pos -= refine
        ring = workload.kv_window + widest_pass(backend, workload.prefill_chunk, slots)
        elastic = ElasticKV(workload.kv_window, ring)
    fixed = sum(weights.values()) + slots * (per_pos + refine) + ring * refine
    shortest = workload.gamma + 2
    upper = (device.usable_bytes - fixed) // per_pos      # memory's bound; the model's positions cap the answer
    dry = DryRun(ckpt, cfg, backend, max(upper, shortest), slots, workload.prefill_chunk, elastic, config.weights) \
        if backend in TRACED_BACKENDS else None

    def workspace(context: int) -> dict[str, int]:
        steps = plan_steps(config, context, workload)
        if dry is not None:
            return dry.workspace(steps)
        if backend == "native":             # a fixed allocation, sized for the largest chunk (its formula)
            from edge.backends.native import (
                draft_head_setting,
                native_threads,
                workspace_bytes,
                workspace_rows,
            )
            rows = workspace_rows(workload.prefill_chunk, slots if config.speculative else workload.gamma)
            parts = workspace_bytes(cfg, rows, native_threads(), context,
                                    r4=ckpt is not None and ckpt.rotations.r4_size is not None,
                                    shortlist=draft_head_setting(ckpt)[1] if ckpt is not None else 0)
            return {"native_step": sum(parts.values())}     # all held at once, unlike the passes above
        act = 2 if device.compute == "gpu" else 4
        steps += split_prefill_tail(context, workload.prefill_chunk, steps[0].view)
        return {s.name: fused_workspace(cfg, s, act, config.weights != "fp16", slots) for s in steps}

    peak: dict[int, int] = {}          # context -> the largest step's workspace (each dry run once)

    def widest(c: int) -> int:
        if c not in peak:
            peak[c] = max(workspace(c).values())
        return peak[c]

    fits = lambda c: fixed + c * per_pos + widest(c) <= device.usable_bytes

    def solve(c1: int, c2: int) -> tuple[int, float]:
        """Where the line through the workspace at c1 and c2 meets the memory left, in [shortest, upper]."""
        slope = (widest(c2) - widest(c1)) / max(1, c2 - c1)
        c = int((device.usable_bytes - fixed - widest(c1) + slope * c1) // (per_pos + slope))
        return max(shortest, min(upper, c)), slope

    slope = 0.0
    if upper < shortest or not fits(shortest):
        best = 0
    else:
        # the workspace grows affinely with the context within a regime: solve the line through the two ends, then
        # (where the ends lie in other regimes) the line through the answer's neighbourhood; each answer is checked
        # (it fits, one more does not) and the whole range is searched only if none checks
        guess, slope = solve(shortest, upper)
        for _ in range(3):
            if fits(guess) and (guess == upper or not fits(guess + 1)):
                best = guess
                break
            guess = solve(guess, guess + LOCAL)[0] if guess + LOCAL <= upper else \
                solve(max(shortest, guess - LOCAL), guess)[0]
        else:
            best = _largest(shortest, upper, fits)
    cap = cfg.max_position_embeddings
    ws = workspace(max(min(best, cap), shortest))
    if dry is None and backend == "gpu-kernels" and best > shortest:    # the formula's growth near the answer (its
        near = max(shortest, best - GROWTH_SPAN)                        # partials step every 128 positions)
        slope = (widest(best) - widest(near)) / (best - near)
    return MemoryPlan(model, config, device, workload, backend, weights, per_pos, slots, min(best, cap),
                      "positions" if best >= cap else "memory", ws, draft_read(cfg, config),
                      slope if dry is not None or backend == "gpu-kernels" else 0.0, best,
                      min(ring, best) if ring and best else ring, refine,
                      workload.kv_window if config.elastic else 0, cap)


def plan_steps(config: RunConfig, context: int, workload: Workload) -> list:
    """The passes at the end of `context` whose workspace a run of `config` plans for (edge.memory.workspace):
    a base-planes run's prefill and steps run the draft view, reading what the draft reads of the KV."""
    base = config.weights == "base"
    return steps_at_end(context, config.speculative, workload.gamma, workload.prefill_chunk, KVRead(config.draft_kv),
                        view="draft" if base else "target")


def fit_context(p: MemoryPlan, requested: int | None, base: MemoryPlan | None = None) -> int:
    """The context to allocate: `requested` if it fits the plan (None = the plan's maximum); a request
    over the maximum is a one-line error naming the largest context that fits. A plan that fits no context names
    what would: `base` (the same checkpoint's bitnest-base plan) where it fits, else the usable memory needed."""
    hint = f"; --weights base fits {base.max_context:,} positions" if base is not None and base.max_context else ""
    if p.max_context < 1 and p.config.elastic:
        raise BitNestError(f"{p.model} does not fit {p.device.name} even with KV4 past a window of {p.kv_window:,} "
                           f"(bitnest-elastic): weights {p.weight_bytes / MiB:,.0f} MiB + the refinement ring's "
                           f"{p.ring_slots:,} slots {p.ring_bytes / MiB:,.0f} MiB leave no room for the base planes "
                           f"in {p.device.usable_bytes / MiB:,.0f} MiB usable: lower --kv-window or use a larger "
                           f"device{hint}")
    if p.max_context < 1:
        least = p.weight_bytes + p.scratch_bytes + p.workspace_bytes + p.kv_bytes(p.workload.gamma + 2)
        fix = hint[2:] if hint else \
            f"it needs at least {least / MiB:,.0f} MiB usable (a device with more memory, or lower reserves)"
        raise BitNestError(f"{p.model} ({p.config.name}) does not fit {p.device.name}: weights alone take "
                           f"{p.weight_bytes / MiB:,.0f} MiB of {p.device.usable_bytes / MiB:,.0f} MiB usable; {fix}")
    if requested is None:
        return p.max_context
    if requested > p.max_context:
        raise BitNestError(f"a context of {requested:,} positions does not fit {p.device.name}: the largest that "
                           f"fits is {p.max_context:,} ({p.model}, {p.config.name}); lower --max-context")
    return requested


def plan_for_runtime(ckpt: Checkpoint, device: str | DeviceProfile, backend: str, prefill_chunk: int,
                     gamma: int, kv_window: int | None = None, weights: str | None = None) -> MemoryPlan:
    """The plan a loaded model (edge.llm) allocates from: the checkpoint run by `backend` with rounds of up to
    `gamma` proposals (draft_slots(gamma) scratch slots; the verification pass of γ + 1 tokens is the widest; 0: no
    drafting ahead, one-token passes); `bitnest-base` where it was loaded with its base planes only (or `weights`
    says so); else with `kv_window`, elastic KV's (bitnest-elastic)."""
    from edge.memory.devices import get_profile
    profile = get_profile(device) if isinstance(device, str) else device
    base = (weights or ckpt.weights) == "base"
    config = CONFIGS["bitnest-base" if base else "bitnest" if kv_window is None else "bitnest-elastic"]
    return plan(ckpt.path.name, ckpt.config, config, profile,
                Workload(max(1, gamma), prefill_chunk, kv_window or DEFAULT_KV_WINDOW), ckpt=ckpt, backend=backend,
                scratch=draft_slots(gamma))


def elastic_kv(window: int, capacity: int, backend: str, prefill_chunk: int, gamma: int) -> ElasticKV:
    """Elastic KV for an engine of `capacity` positions and rounds of up to `gamma` proposals: the window, and a ring
    of window + the widest pass's slots (as the plan counts them); a window that is not smaller than the context is
    a one-line error."""
    if window >= capacity:
        raise BitNestError(f"a KV window of {window:,} positions is not smaller than the context of {capacity:,}: "
                           f"lower --kv-window below {capacity:,} (or raise --max-context)")
    return ElasticKV(window, window + widest_pass(backend, prefill_chunk, draft_slots(gamma)))


def check_request(p: MemoryPlan, capacity: int, prompt: int, max_new_tokens: int) -> None:
    """Refuse, before any work, a request whose prompt and new tokens need more positions than were allocated."""
    need = prompt + max_new_tokens
    if need > capacity:
        raise BitNestError(f"the request needs {need:,} positions (prompt {prompt:,} + max new tokens "
                           f"{max_new_tokens:,}) but {capacity:,} are allocated; the largest context that fits "
                           f"{p.device.name} is {p.max_context:,}: shorten the prompt or lower --max-new-tokens")
