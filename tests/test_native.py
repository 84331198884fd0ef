"""The native C++ plugins (plugins/native) against the pure-torch oracle on fresh random inputs: the dual-plane
linear for both views, RTN and top4of8 codes, decode-sized M, every group size the kernels take, on every kernel set
(AVX-512 VNNI, AVX-VNNI, AVX2 and the portable C++; a set this CPU lacks skips with the reason); rows independent of M
bit for bit, and the same bits on every kernel set; the KV write bit-exact against plugins.kv; nested-KV attention
for every KV view, GQA and scratch slots; two first-use builds at once into one cache folder build once (the build
lock) and both run the native backend."""

import pytest
import torch

from plugins import reference
from plugins.kv import quantize_kv
from plugins.nesting import nest_rtn, nest_top4of8
from plugins.packing import pack_nibbles

native = pytest.importorskip("plugins.native")
if native.unavailable():
    pytest.skip(f"native plugins unavailable: {native.unavailable()}", allow_module_level=True)

ISAS = [n for n in native.ISA_NAMES if not n.startswith("neon")]     # aarch64: tests/test_native_cross.py


@pytest.fixture(params=ISAS)
def isa(request):
    if request.param not in native.runnable_isas():
        pytest.skip(f"this CPU does not run the {request.param} kernels (it runs {', '.join(native.runnable_isas())})")
    return request.param
# float32 group scaling and float sums in the kernels' own order against a float64 oracle with exact integers
LINEAR_REL = 1e-6
ATTENTION_REL = 2e-6


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def _planes(gen, n, k, g, method):
    w = torch.randn(n, k, generator=gen) * 0.05
    c = nest_rtn(w, g) if method == "rtn" else nest_top4of8(w, g)
    return pack_nibbles(c.q4), pack_nibbles(c.qr), c.scale, c.offset


@pytest.mark.parametrize("n, k, g, method", [(96, 576, 64, "rtn"), (37, 1536, 128, "rtn"), (21, 768, 192, "rtn"),
                                             (40, 512, 256, "rtn"), (50, 576, 64, "top4of8")])
def test_dual_plane_linear_matches_the_oracle(gen, isa, n, k, g, method):
    base, refine, scale, offset = _planes(gen, n, k, g, method)
    for m in (1, 5, 9):
        x = torch.randn(m, k, generator=gen) * 3
        for view in ("draft", "target"):
            want = reference.dual_plane_linear(x, base, refine, scale, view, offset, act_int8=True)
            got = native.dual_plane_linear(x, base, refine if view == "target" else None, scale, view, offset, isa=isa)
            assert got.dtype == torch.float32 and got.shape == (m, n)
            err = _rel(got, want)
            assert err < LINEAR_REL, f"{isa} N={n} K={k} G={g} {method} M={m} {view}: rel err {err:.2e}"


def test_rows_do_not_depend_on_the_number_of_tokens(gen, isa):
    """What makes verification lossless: a pass over M tokens gives bit for bit what M one-token passes give."""
    base, refine, scale, offset = _planes(gen, 64, 576, 64, "rtn")
    x = torch.randn(7, 576, generator=gen)
    for view in ("draft", "target"):
        batch = native.dual_plane_linear(x, base, refine, scale, view, offset, isa=isa)
        rows = torch.cat([native.dual_plane_linear(x[i:i + 1], base, refine, scale, view, offset, isa=isa)
                          for i in range(7)])
        assert torch.equal(batch, rows), f"{isa} {view}"


def test_every_kernel_set_gives_the_same_rows(gen):
    """Exact integer group sums and the same float operations per row: a row is the same bits on every kernel set
    this CPU runs, so a forced ISA changes speed, never output."""
    runs = [i for i in ISAS if i in native.runnable_isas()]
    for method, g in (("rtn", 64), ("top4of8", 128)):
        base, refine, scale, offset = _planes(gen, 80, 768, g, method)
        x = torch.randn(6, 768, generator=gen) * 2
        for view in ("draft", "target"):
            outs = {i: native.dual_plane_linear(x, base, refine, scale, view, offset, isa=i) for i in runs}
            for i in runs:
                assert torch.equal(outs[i], outs["generic"]), f"{method} {view}: {i} differs from the portable kernel"


def test_draft_never_reads_the_refinement(gen):
    base, refine, scale, _ = _planes(gen, 32, 576, 64, "rtn")
    x = torch.randn(3, 576, generator=gen)
    want = native.dual_plane_linear(x, base, refine, scale, "draft")
    assert torch.equal(native.dual_plane_linear(x, base, torch.randint(0, 256, refine.shape, dtype=torch.uint8),
                                                scale, "draft"), want)
    assert torch.equal(native.dual_plane_linear(x, base, None, scale, "draft"), want)


def test_kv_write_is_bit_exact(gen, isa):
    x = torch.randn(2, 3, 45, 64, generator=gen) * torch.rand(2, 3, 45, 1, generator=gen) * 10
    x[0, 0, 0] = 0.0                                            # an all-zero vector takes the smallest scale
    for got, want in zip(native.quantize_kv(x, isa=isa), quantize_kv(x)):
        assert torch.equal(got, want), isa


@pytest.mark.parametrize("hq, hkv", [(9, 3), (4, 4), (8, 1)])
def test_nested_kv_attention_matches_the_oracle(gen, isa, hq, hkv):
    d, cap, t, length = 64, 48, 5, 37
    kb, kr, ks = quantize_kv(torch.randn(2, hkv, cap, d, generator=gen))
    q = torch.randn(hq, t, d, generator=gen)
    for label, kv8_from in (("kv8", 0), ("kv4", length), ("recent-9", length - 9)):
        want = reference.nested_kv_attention(q, kb, kr, ks, length, kv8_from)
        err = _rel(native.nested_kv_attention(q, kb, kr, ks, length, kv8_from, isa=isa), want)
        assert err < ATTENTION_REL, f"{isa} Hq={hq} Hkv={hkv} {label}: rel err {err:.2e}"
    split = tuple(p[..., 30:length, :] if p.dim() == 4 else p[..., 30:length] for p in (kb, kr, ks))
    got = native.nested_kv_attention(q, kb, kr, ks, 30, 4, scratch=tuple(s.contiguous() for s in split),
                                     scratch_len=length - 30, isa=isa)
    assert _rel(got, reference.nested_kv_attention(q, kb, kr, ks, length, 4)) < ATTENTION_REL


def test_attention_queries_do_not_depend_on_the_pass(gen, isa):
    kb, kr, ks = quantize_kv(torch.randn(2, 3, 40, 64, generator=gen))
    q = torch.randn(9, 5, 64, generator=gen)
    batch = native.nested_kv_attention(q, kb, kr, ks, 33, 0, isa=isa)
    for i in range(5):           # query i alone, over exactly the positions it saw in the pass
        alone = native.nested_kv_attention(q[:, i:i + 1], kb, kr, ks, 29 + i, 0, isa=isa)
        assert torch.equal(batch[:, i:i + 1], alone), f"{isa} query {i}"


def test_shapes_the_kernels_do_not_take_are_one_line_errors(gen):
    base, refine, scale, _ = _planes(gen, 8, 128, 32, "rtn")         # group size 32
    with pytest.raises(RuntimeError, match="group size 32"):
        native.dual_plane_linear(torch.randn(1, 128), base, refine, scale, "target")
    with pytest.raises(RuntimeError, match="unknown weight view"):
        torch.ops.bitnest.dual_plane_linear(torch.randn(1, 128), base, refine, scale, "half", None, "")


LOADER = ("from edge.backends import resolve_backend; from plugins import native; print('loading', flush=True); "
          "print(resolve_backend('auto'), native.best_isa() if native.unavailable() is None else native.unavailable(), "
          "flush=True)")      # imports done: next, the lock


def test_two_first_use_builds_at_once_build_once_and_both_load(tmp_path, monkeypatch):
    """Two processes load the native plugins at once into a fresh cache folder. While this test holds the build lock
    neither compiles anything (it waits at the lock: no ninja file, no library appear), and a third that may wait one
    second gives up with the one-line reason naming the lock (its backend then `cpu`); released, both run the `native`
    backend (never the `cpu` fallback) and the library was built once (one line in builds.log). The folder starts as
    a copy of this process's build without its library (the same sources, file times kept), so the build they race
    for is ninja's link of the compiled objects: seconds, where a first compile takes 30-60 s on 2 cores, under the
    same lock."""
    import fcntl
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from edge.backends.native import native_unavailable
    monkeypatch.delenv(native.ISA_ENV, raising=False)
    if native_unavailable():
        pytest.skip(f"`auto` is not the native backend on this CPU: {native_unavailable()}")
    import shutil
    native.load()
    built = native.build_folder()
    monkeypatch.setenv("BITNEST_CACHE", str(tmp_path))
    folder = native.build_folder()
    shutil.copytree(built, folder, ignore=shutil.ignore_patterns(native.BUILD_LOCK, native.BUILD_LOG, "lock", "*.so"))
    copied = {f.name: f.stat().st_mtime_ns for f in folder.iterdir()}
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root))

    def loader(**extra):
        return subprocess.Popen([sys.executable, "-c", LOADER], cwd=root, env=dict(env, **extra), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    with open(folder / native.BUILD_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        procs = [loader(), loader()]
        impatient = loader(**{native.LOCK_TIMEOUT_ENV: "1"})
        for p in procs:
            assert p.stdout.readline().strip() == "loading", p.communicate()
        start = time.monotonic()
        out, err = impatient.communicate(timeout=300)
        assert impatient.returncode == 0, err[-2000:]
        backend, reason = out.splitlines()[-1].split(" ", 1)
        assert backend == "cpu" and "another process has held the native build lock" in reason, out
        assert str(folder / native.BUILD_LOCK) in reason and "BITNEST_BUILD_LOCK_TIMEOUT" in reason, reason
        time.sleep(max(0.0, 3 - (time.monotonic() - start)))   # time enough for either to write its ninja file
        assert all(p.poll() is None for p in procs), "a loader finished while another process held the build lock"
        now = {f.name: f.stat().st_mtime_ns for f in folder.iterdir()}
        assert now == dict(copied, **{native.BUILD_LOCK: now.get(native.BUILD_LOCK)}), f"built while the lock was held: {now}"
        fcntl.flock(lock, fcntl.LOCK_UN)
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0 and out.split()[-2] == "native", err[-2000:]
        assert out.split()[-1] in native.ISA_NAMES, out
    builds = (folder / native.BUILD_LOG).read_text().splitlines()
    assert len(builds) == 1, builds


def test_a_killed_builds_lock_file_does_not_hang_the_next_load(tmp_path):
    """cpp_extension's own lock file, left by a build killed mid-way, is cleared under the build lock once nothing else
    in the folder has been written for BITNEST_STALE_BATON_S seconds (900 by default; 2 here): the next load in a fresh
    process runs instead of waiting on it forever. The folder is a copy of this process's build (same sources: nothing
    to compile, file times kept)."""
    import os
    import shutil
    import subprocess
    import sys
    import time
    from pathlib import Path
    built = native.build_folder()
    folder = tmp_path / built.relative_to(built.parents[1])
    shutil.copytree(built, folder, ignore=shutil.ignore_patterns(native.BUILD_LOCK, "lock"))
    (folder / "lock").touch()
    newest = max(f.stat().st_mtime for f in folder.iterdir() if f.name != "lock")
    os.utime(folder / "lock", (newest, newest))
    time.sleep(max(0.0, newest + 2.5 - time.time()))
    started = time.time()
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), BITNEST_CACHE=str(tmp_path), **{native.STALE_BATON_ENV: "2"})
    r = subprocess.run([sys.executable, "-c", "from plugins import native; native.load(); print(native.best_isa())"],
                       cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.split()[-1] in native.ISA_NAMES, r.stderr[-2000:]
    # the stale file is gone; torch 2.14's cpp_extension leaves a lock file of its own after every load (2.13 removes
    # its baton), which is new, not the stale one
    lock = folder / "lock"
    assert not lock.exists() or lock.stat().st_mtime >= started - 1.0
