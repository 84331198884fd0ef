"""The proxy on what the `triton` backend really launches (`bitnest compile-kernels --launches CHECKPOINT|PRESET`): the
backend's engine for a checkpoint runs a speculative round's passes (a prefill chunk, a draft pass, the γ+1-token
verification) and a target and a draft step, under `plugins.kernels.launches.captured_launches(arch)`: Triton's JIT
binds, specializes and compiles every launch for sm_`arch` as on that GPU, and nothing runs. Each distinct variant
is then compiled and summarized as `bitnest compile-kernels` summarizes its specs (plugins.kernels.aot: registers,
spills, the SASS proxy and its budgets), so a launcher that drifts from the hand-written specs, or an option a
Triton version does not accept, shows here without a GPU."""

from pathlib import Path

from edge.engine.kv_cache import KVRead
from edge.memory.workspace import Step, run_step, steps_at_end

CONTEXT = 200         # positions before the passes' ends: past one attention chunk, inside any model's window


def passes(gamma: int, prefill_chunk: int) -> list[Step]:
    """A speculative round's passes at the end of CONTEXT positions, then a target and a draft step."""
    return (steps_at_end(CONTEXT, True, gamma, prefill_chunk, KVRead("kv4"))
            + steps_at_end(CONTEXT, False, gamma, prefill_chunk, KVRead("kv4"))[1:]
            + steps_at_end(CONTEXT, False, gamma, prefill_chunk, KVRead("kv4"), view="draft")[1:])


def _checkpoint(checkpoint: str):
    """A checkpoint folder, or a model-shape preset (edge.memory.model_shapes) as one decoder block of random planes
    with the default export's head and online rotations: every launch a block makes at those shapes (the blocks of a
    model launch the same variants), at a memory a PC holds (`compile-kernels --launches`: 1.7 GB peak resident
    for Llama-2-7B's block and head, 2.4 GB for Qwen2.5-1.5B's, its head 151,936 rows)."""
    from dataclasses import replace

    from edge.memory.model_shapes import MODEL_PRESETS
    if checkpoint not in MODEL_PRESETS:
        from edge.errors import BitNestError
        from edge.model.checkpoint import load_checkpoint
        if not Path(checkpoint).is_dir():
            raise BitNestError(f"--launches {checkpoint}: no checkpoint folder there and no model preset of that name "
                               f"(presets: {', '.join(MODEL_PRESETS)})")
        return load_checkpoint(checkpoint)
    from edge.memory.synthetic import exported_shapes, with_online_rotations
    return with_online_rotations(exported_shapes(replace(MODEL_PRESETS[checkpoint], num_layers=1), "cpu"))


def backend_launches(checkpoint: str, arch: int, ptx_version: int | None = None, sms: int | None = None,
                     gamma: int = 4, prefill_chunk: int = 64, compile_them: bool = True) -> list:
    """The launches (plugins.kernels.launches.Launch) of the triton backend's engine on `checkpoint` (a folder or a
    model-shape preset: `_checkpoint`): its load and `passes`, compiled for sm_`arch` (at PTX ISA `ptx_version`) on a
    GPU of `sms` SMs (captured_launches' default: Orin NX's 8 for sm_87), in launch order (`compile_them` False:
    recorded, not compiled)."""
    from edge.backends import make_engine
    from edge.engine import draft_slots
    from plugins.kernels.launches import captured_launches
    ckpt = _checkpoint(checkpoint)
    with captured_launches(arch, ptx_version, sms, compile_them) as launches:
        eng = make_engine("triton", ckpt, CONTEXT + prefill_chunk, scratch=draft_slots(gamma),
                          prefill_chunk=prefill_chunk)
        for step in passes(gamma, prefill_chunk):
            run_step(eng, step)
    return launches


def compile_launches(checkpoint: str, out_dir: Path, arch: int, ptx_version: int, sms: int | None = None,
                     gamma: int = 4) -> list[dict]:
    """`aot.compile_spec`'s summary of each distinct variant the backend launches on `checkpoint`, as Triton's
    launch compiled it (at PTX ISA `ptx_version`, as `bitnest compile-kernels` pins it), with its constants
    ("constexprs")."""
    from plugins.kernels.aot import summarize
    from plugins.kernels.launches import distinct, launch_spec
    launches = backend_launches(checkpoint, arch, ptx_version, sms, gamma)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, launch in distinct(launches).items():
        row = summarize(launch.kernel, launch_spec(launch, name), out_dir, arch)
        row["constexprs"] = {k: v if isinstance(v, (bool, int, float, str, type(None))) else str(v)
                             for k, v in launch.constexprs.items()}
        rows.append(row)
    return rows
