"""The device check's opt-in `gptq` section (export.tools.device_gptq) on the CPU: its comparison with the committed
CPU figures, the opt-in, a child stopped before the section's limit, and the whole section in its dry form (the same
export and evaluation scripts on the CPU, RTN at a tiny calibration). The real comparison needs CUDA (marked `gpu`)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT

STAND_IN = '''import json, sys, time
json.dump(sys.argv[1:], open({argv!r}, "w"))
print("export plan: peak 1.01 GiB resident", file=sys.stderr, flush=True)
print("layers:  10%|#         | 3/30 [00:05<00:45]", file=sys.stderr, flush=True)
time.sleep(600)
'''


def _shifted(cpu: dict, points: dict) -> dict:
    """The committed evaluation with each corpus's agreement moved by `points`, rounded as evaluate rounds (4 places)."""
    return {"agreement": {c: round(v + points.get(c, 0) / 100, 4) for c, v in cpu["agreement"].items()},
            "tokens": dict(cpu["tokens"])}


def test_agreement_within_half_a_point_of_the_committed_figure_passes_and_past_it_fails():
    """Against the committed row of scripts/results/quality.json: 0.5 points either way on every corpus passes;
    0.6 points up, or down, on one corpus fails naming it; every corpus records both figures and the difference."""
    from export.tools.device_gptq import committed, judge
    cpu = committed()
    assert set(cpu["agreement"]) == {"sharegpt", "shakespeare", "code"}
    ok = judge(_shifted(cpu, {"sharegpt": 0.5, "shakespeare": -0.5}), cpu)
    assert ok["status"] == "passed" and ok["passed"] and ok["reason"] is None, ok
    assert ok["corpora"]["sharegpt"] == {"committed": cpu["agreement"]["sharegpt"],
                                         "measured": round(cpu["agreement"]["sharegpt"] + 0.005, 4),
                                         "difference_points": 0.5, "within": True}
    assert ok["corpora"]["shakespeare"]["difference_points"] == -0.5 and ok["corpora"]["code"]["within"]
    for points in (0.6, -0.6):
        bad = judge(_shifted(cpu, {"code": points}), cpu)
        assert bad["status"] == "failed" and bad["passed"] is False, (points, bad)
        assert bad["reason"] == f"code {points} points from the CPU export (bound 0.5)", bad
        assert not bad["corpora"]["code"]["within"] and bad["corpora"]["sharegpt"]["within"]
    missing = judge({"agreement": {"sharegpt": 0.79}, "tokens": cpu["tokens"]}, cpu)
    assert missing["status"] == "failed" and missing["corpora"]["code"]["measured"] is None


def test_the_evaluation_is_the_committed_one():
    """The section evaluates as the committed figures were evaluated (README: quality_table.py --tokens 4096; its
    window, backend, activations and draft head from the row), and an evaluation that counted other tokens than the
    committed row fails even where the figures agree."""
    from edge.analysis.report.tables import DEFAULT_ROW
    from export.tools.device_gptq import CPU_TOKENS, committed, evaluate_command, export_command, judge
    cpu = committed()
    assert cpu["row"] == DEFAULT_ROW                          # the row README's headline renders
    windows = range(0, CPU_TOKENS - 1, cpu["window"])        # edge.analysis.evaluate's windows over --tokens ids
    assert all(n == sum(min(cpu["window"], CPU_TOKENS - s) - 1 for s in windows) for n in cpu["tokens"].values())
    cmd = evaluate_command(Path("CK"), cpu, CPU_TOKENS)
    assert cmd[1:] == ["-m", "export.commands", "evaluate", "--checkpoint", "CK", "--tokens", "4096", "--window", "1024",
                       "--backend", "torch", "--act", "float", "--draft-head", "8bit", "--json"]
    assert export_command(Path("OUT"), dry=False)[1:] == ["-m", "export.commands", "export", "--out", "OUT",
                                                         "--device", "cuda", "--json"]
    other = _shifted(cpu, {})
    other["tokens"]["code"] -= 4
    r = judge(other, cpu)
    assert r["status"] == "failed" and r["reason"].startswith("not the committed evaluation: code counted"), r
    dry = judge(_shifted(cpu, {"code": 3.0}), cpu, dry=True)          # a tiny calibration: figures, no verdict
    assert (dry["status"], dry["passed"], dry["reason"]) == ("dry: plumbing only", None, None)
    assert dry["corpora"]["code"]["difference_points"] == 3.0


def test_the_gptq_section_is_opt_in(tmp_path, monkeypatch):
    """The default sections leave it out and the JSON says why; --with-gptq asks for it; a section that is not
    asked for fails nothing, and its table line says it was not run."""
    from edge.analysis.report.device import table
    from export.commands.device_check import main, parser
    from export.tools.device_check import DeviceCheckOptions, run_device_check, section_status
    assert "gptq" not in DeviceCheckOptions().chosen
    assert DeviceCheckOptions(with_gptq=True).chosen[-1] == "gptq"
    assert "gptq" not in DeviceCheckOptions(sections=("kernels",), with_gptq=True).chosen
    assert parser().parse_args(["--with-gptq"]).with_gptq and not parser().parse_args([]).with_gptq
    monkeypatch.setenv("TRITON_INTERPRET", "1")                # a dry run's precondition (no kernel runs here)
    r = run_device_check(DeviceCheckOptions(dry=True, sections=("gptq",)), tmp_path / "r.json")
    assert r["sections"]["gptq"] == {"status": "not run", "reason": "opt-in (--with-gptq)"}
    assert "GPTQ export on CUDA: not run (opt-in (--with-gptq))." in table(r)
    assert json.loads((tmp_path / "r.json").read_text())["sections"]["gptq"]["reason"] == "opt-in (--with-gptq)"
    assert section_status("gptq", {"status": "dry: plumbing only", "reason": None}, True)["status"] == \
        "dry: plumbing only"
    env = dict(os.environ, DRY="1", OUT=str(tmp_path / "script"))
    out = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--sections", "gptq"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    script = json.loads((tmp_path / "script" / "device_check.json").read_text())
    assert script["sections"]["gptq"] == {"status": "not run", "reason": "opt-in (--with-gptq)"}, out.stderr[-2000:]
    assert main(["--table", str(tmp_path / "script" / "device_check.json")]) == 0
    # --with-gptq reaches the section through the script (the section hangs here: no export, 1 s)
    out = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--with-gptq", "--sections", "gptq",
                          "--hang", "gptq", "--limits", "gptq=1"], capture_output=True, text=True, env=env,
                         timeout=300, cwd=ROOT)
    asked = json.loads((tmp_path / "script" / "device_check.json").read_text())
    assert asked["gptq"] == {"error": "SectionTimeout: timed out after 1 s (its limit)"}, out.stderr[-2000:]
    assert asked["sections"]["gptq"]["status"] == "error" and not asked["passed"]


def test_a_child_past_the_limit_is_stopped_and_its_last_lines_kept(tmp_path):
    """An export that outlasts the section (a stand-in script that prints progress and sleeps), run as the device
    check runs a section (under its SIGALRM limit): stopped GPTQ_STOP_MARGIN s before the limit, so the section
    returns, fails naming the step and its last line, keeps its last lines, and leaves no child running. It was
    given the default export's options with --device cuda."""
    from export.tools.device_check import _within
    from export.tools.device_gptq import GPTQ_STOP_MARGIN, gptq_section
    argv = tmp_path / "argv.json"
    stand_in = tmp_path / "slow_export.py"
    stand_in.write_text(STAND_IN.format(argv=str(argv)))
    limit = 8.0
    t0 = time.monotonic()
    r = _within(limit, lambda: gptq_section(limit, export_program=(sys.executable, str(stand_in))))
    assert time.monotonic() - t0 < limit
    stop = limit - GPTQ_STOP_MARGIN
    assert r["status"] == "failed" and r["passed"] is False and "corpora" not in r and "evaluation" not in r, r
    assert r["reason"] == (f"timed out after {stop:g} s (the section's limit {limit:g} s less {GPTQ_STOP_MARGIN:g}) "
                           "in the export: layers:  10%|#         | 3/30 [00:05<00:45]"), r["reason"]
    assert r["export"]["tail"] == ["export plan: peak 1.01 GiB resident", "layers:  10%|#         | 3/30 [00:05<00:45]"]
    # the child's clock starts after the section's own (its deadline is the section's start + stop), so on a loaded
    # host it has run for less than `stop` when it is killed (5.5 s of 6 seen): killed at the deadline, not later
    assert 0 < r["export"]["wall_seconds"] <= stop + 1.0 and r["export"]["rc"] == -9
    got = json.loads(argv.read_text())
    assert got[0] == "--out" and got[2:] == ["--device", "cuda", "--json"], got
    assert "--device cuda --json" in r["commands"]["export"] and r["device"] == "cuda"


def test_the_gptq_section_runs_dry_on_the_cpu(tmp_path):
    """DRY=1 scripts/device_check.sh --with-gptq --sections gptq: the real export (the default model, --device cpu,
    RTN, 2 x 32 calibration tokens) and the real evaluation (64 tokens a corpus), both figures per corpus, no verdict on
    them, the export's seconds and peak memory, the table line. ~20 s on an idle 2-core CPU; the limit is raised
    since a loaded one (the suite's workers beside it) has taken 260 s for the export alone."""
    env = dict(os.environ, DRY="1", OUT=str(tmp_path), DEVICE_CHECK_TIMEOUT="1000")
    out = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--with-gptq", "--sections", "gptq",
                          "--limits", "gptq=900"], capture_output=True, text=True, env=env, timeout=1100, cwd=ROOT)
    r = json.loads((tmp_path / "device_check.json").read_text())
    g = r["gptq"]
    assert out.returncode == 0 and r["complete"], (out.stderr[-2000:], g)
    assert g["status"] == "dry: plumbing only" and g["passed"] is None and g["device"] == "cpu", g
    assert r["sections"]["gptq"]["status"] == "dry: plumbing only" and r["passed"]
    assert "--device cpu --json --method rtn --calib-samples 2 --calib-seq-len 32" in g["commands"]["export"]
    assert "--tokens 64 " in g["commands"]["evaluation"]
    assert set(g["corpora"]) == {"sharegpt", "shakespeare", "code"}
    for corpus, v in g["corpora"].items():
        assert 0 < v["measured"] <= 1 and v["committed"] == g["committed"]["agreement"][corpus]
        assert v["difference_points"] == round(100 * (v["measured"] - v["committed"]), 4)
    assert g["export"]["seconds"] > 0 and g["export"]["peak_rss_bytes"] > 2 ** 20 and g["evaluation"]["seconds"] > 0
    assert g["evaluation"]["tokens"] == {"sharegpt": 63, "shakespeare": 63, "code": 63}
    assert "GPTQ export on cpu: dry: plumbing only (draft/target agreement" in (tmp_path / "device_check.md").read_text()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_gptq_export_on_cuda_gives_the_cpu_exports_agreement():
    """The section itself on a GPU: GPTQ on CUDA, the committed evaluation, every corpus within 0.5 points."""
    from export.tools.device_check import LIMITS
    from export.tools.device_gptq import gptq_section
    r = gptq_section(LIMITS["gptq"])
    assert r["status"] == "passed", r
