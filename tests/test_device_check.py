"""scripts/device_check.sh, the one prepared script for a CUDA machine, run here in its dry mode (the Triton
interpreter on the CPU, tiny shapes): every section's code runs, so a typo cannot waste device time."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge.analysis.report.device import bandwidth_table
from tests.conftest import ROOT, read_until



def test_device_check_script_runs_dry(tmp_path):
    """Every section but `plugins` (its suites run in this suite already; its own test is below)."""
    (tmp_path / "tmp").mkdir(exist_ok=True)      # a section stopped at its limit leaves its temporary folder here
    env = dict(os.environ, DRY="1", OUT=str(tmp_path), TMPDIR=str(tmp_path / "tmp"))
    out = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--repeats", "1", "--sections",
                          "kernels,bandwidth,prefill,lossless,pass_times,profile,tensorrt"], capture_output=True,
                         text=True, env=env, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads((tmp_path / "device_check.json").read_text())
    assert r["dry"] and r["environment"]["interpreter"] and r["complete"] and "running" not in r
    for section in ("kernels", "bandwidth", "prefill", "lossless", "pass_times", "profile"):
        assert "error" not in r[section], (section, r[section])
    assert r["passed"] and r["kernels"]["passed"] and r["lossless"]["identical"]
    assert r["kernels"]["unit_tests"]["counts"] == {"passed": 1}             # the dry run's one unit test, in a child
    assert r["bandwidth"]["copy_GBps"] > 0 and r["bandwidth"]["gemv"] and r["bandwidth"]["attention"]
    assert set(r["pass_times"]["tiny"]) == {"eager", "static"}                 # graphs only where CUDA is
    assert all(v > 0 for form in r["pass_times"]["tiny"].values() for v in form.values())
    assert r["projection"]["tiny"]["static"] > 0 and r["projection"]["tokens_per_round"] > 1
    assert {(g["M"], g["view"], g["act"]) for g in r["bandwidth"]["gemv"] if g["kernel"] == "dual_plane_linear"} == \
        {(m, v, "int8") for m in (1, 5, 8) for v in ("draft", "target")}        # the decode kernel's widths
    assert {(g["M"], g["view"]) for g in r["bandwidth"]["gemv"] if g["kernel"] == "dual_plane_linear_tiled"} == \
        {(m, v) for m in (1, 5, 8) for v in ("draft", "target")}                # and on the backend's tiled planes
    pre = r["prefill"]["rows"]               # a prefill chunk: tensor cores against the decode kernel, both views
    assert [(p["M"], p["view"]) for p in pre] == [(12, "draft"), (12, "target")], pre
    assert all(p["gemm_us"] > 0 and p["decode_us"] > 0 and p["speedup"] > 0 and p["gemm_TOPS"] > 0 for p in pre)
    assert r["prefill"]["identical"] and all(p["identical"] for p in pre)      # the same bits by both paths
    attn = r["prefill"]["attention"]         # its attention: the prefill kernel against the split kernel
    assert [(a["T"], a["context"]) for a in attn] == [(40, 200)] and r["prefill"]["attention_close"], attn
    assert all(a["prefill_us"] > 0 and a["split_us"] > 0 and a["rel_diff"] < 5e-5 for a in attn), attn
    # 4 query heads over 2 KV heads at d32: 32-row tiles of 16 queries, 40 queries in 3 tiles a KV head; one read of
    # the planes (K and V, 16 base + 16 refinement bytes a position and head) and their float16 scales
    assert [a["programs"] for a in attn] == [2 * 3] and all(a["prefill_GBps"] > 0 for a in attn), attn
    kv_bytes = 2 * 2 * 200 * (32 + 2)
    assert all(abs(a["prefill_GBps"] * a["prefill_us"] * 1e3 - kv_bytes) < 1e-6 * kv_bytes for a in attn), attn
    steps = r["step_bandwidth"]["tiny"]
    assert steps["bytes"]["verify"] == steps["bytes"]["target"] > steps["bytes"]["draft"] > 0   # weights read once a pass
    for form, t in r["pass_times"]["tiny"].items():          # bytes / pass time / copy bandwidth, per pass
        want = steps["bytes"]["target"] / (t["target_ms"] / 1e3) / (r["bandwidth"]["copy_GBps"] * 1e9)
        assert abs(steps[form]["target"] - want) <= 1e-3 * want + 1e-3, (form, steps[form], want)
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        assert r["tensorrt"]["status"] == "skipped" and "TensorRT" in r["tensorrt"]["reason"]
        assert "TensorRT is not installed here" in out.stderr
    md = (tmp_path / "device_check.md").read_text()
    assert "| tiny | static |" in md and "Kernels against the oracle: all passed" in md
    assert "Prefill chunk of 12 tokens, tensor-core kernel against the decode kernel" in md
    assert "Its attention (a chunk of 40 at 200 positions first), the prefill kernel against the split kernel" in md
    assert "| tiny gqa 4/2 | 200 | 40 |" in bandwidth_table(r)            # the docs' table of the committed run
    assert "Whole passes, weight bytes over pass time" in md and "GEMV (tiled planes, the triton backend's) at the other shapes M = 5 target" in md
    prof = r["profile"]["tiny"]                    # the interpreter: the host's ops stand in for kernels
    assert prof["form"] == "static" and {"draft", "target", "verify"} <= set(prof)
    assert all(prof[k]["wall_ms"] > 0 and prof[k]["launches"] > 0 and prof[k]["families"] for k in ("draft", "target"))
    assert "| tiny | static | target |" in md and "A target pass's device time by kernel family" in md
    status = {k: v["status"] for k, v in r["sections"].items()}
    assert status == {"kernels": "passed", "bandwidth": "measured", "prefill": "passed", "lossless": "passed",
                      "pass_times": "measured",
                      "profile": "measured", "plugins": "not run", "tensorrt": r["tensorrt"]["status"],
                      "gptq": "not run"}


def test_the_plugins_section_runs_the_suites_and_reports_a_failure(tmp_path):
    """The plugins section runs its suites in a pytest process of its own and passes only where none failed: one
    real suite passes; a suite with a failing test beside it fails the section and names the test."""
    from export.tools.device_plugins import plugins_section
    ok = plugins_section(120, ("tests/test_trt_inspect.py",))
    assert ok["passed"] and ok["counts"]["passed"] >= 10 and not ok["failures"] and ok["device"] == "cpu"
    bad = tmp_path / "test_broken_plugin.py"
    bad.write_text("def test_enqueue_writes_its_outputs():\n    assert 1 + 1 == 3\n")
    r = plugins_section(120, ("tests/test_trt_inspect.py", str(bad)))
    assert not r["passed"] and r["counts"]["failed"] == 1 and r["counts"]["passed"] == ok["counts"]["passed"]
    assert any("test_enqueue_writes_its_outputs" in f for f in r["failures"])
    gone = plugins_section(120, ("tests/no_such_suite.py",))
    assert gone["status"] == "skipped" and "no_such_suite.py" in gone["reason"]


def test_a_failing_kernel_unit_test_fails_the_kernels_section(tmp_path, monkeypatch):
    """The kernels section passes only where the oracle checks and the kernels' unit tests on the device both pass:
    a failing unit test (here a suite beside the dry run's one test) fails it and is named."""
    from export.tools import device_check as dc
    bad = tmp_path / "test_broken_kernel.py"
    bad.write_text("def test_group_of_32_compiles():\n    assert 16 >= 32\n")
    monkeypatch.setattr(dc, "KERNEL_TESTS_DRY", (*dc.KERNEL_TESTS_DRY, str(bad)))
    r = dc.kernels(dc.DeviceCheckOptions(dry=True, repeats=1))
    assert all(c["passed"] for c in r["checks"]) and not r["passed"]
    assert r["unit_tests"]["counts"] == {"passed": 1, "failed": 1}
    assert any("test_group_of_32_compiles" in f for f in r["unit_tests"]["failures"])


@pytest.mark.parametrize("absent", ["pytest", "onnx"])
def test_the_plugins_section_fails_without_pytest_or_onnx_on_a_real_run(tmp_path, absent):
    """In an interpreter that really lacks the module (python -S: no site-packages; where only onnx is to be absent,
    pytest's package linked onto the path), a real run's plugins section fails in one line naming the install and
    fails the device check's verdict; a dry run skips with the same line."""
    from export.tools.device_check import section_status
    site = tmp_path / "site"
    site.mkdir()
    if absent == "onnx":
        (site / "pytest").symlink_to(Path(pytest.__file__).parent)
    code = ("import json; from export.tools.device_plugins import plugins_section; "
            "print(json.dumps([plugins_section(60, dry=dry) for dry in (False, True)]))")
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{site}")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, timeout=60,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    real, dry = json.loads(out.stdout)
    assert real["status"] == "failed" and real["passed"] is False, real
    assert real["reason"].startswith(f"{absent} is not installed here (pip install {absent})")
    assert "\n" not in real["reason"] and dry == {"status": "skipped", "reason": real["reason"]}
    assert section_status("plugins", real, True) == {"status": "failed", "reason": real["reason"]}


def test_the_plugins_section_stops_its_child_before_its_limit_and_names_the_running_test(tmp_path):
    """A suite whose second test outlasts the section: run as the device check runs a section (under its SIGALRM
    limit), the pytest child is stopped PLUGINS_STOP_MARGIN s before the limit, so the section returns instead of
    timing out, fails, and keeps what the child had printed: the test it was in and the one that passed."""
    from export.tools.device_check import _within
    from export.tools.device_plugins import PLUGINS_STOP_MARGIN, plugins_section
    suite = tmp_path / "test_slow_plugin.py"
    suite.write_text("import time\n\n\ndef test_quick():\n    pass\n\n\n"
                     "def test_waits_for_the_device():\n    time.sleep(600)\n")
    limit = 15.0
    r = _within(limit, lambda: plugins_section(limit, (str(suite),)))
    assert r["status"] == "failed" and not r["passed"], r
    assert r["running"].endswith("test_slow_plugin.py::test_waits_for_the_device"), r
    assert r["counts"] == {"passed": 1, "failed": 0, "skipped": 0}
    assert r["reason"] == f"timed out after {limit - PLUGINS_STOP_MARGIN:g} s in {r['running']}"


def test_device_check_without_a_gpu_says_so():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the check runs instead of refusing")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "export.commands", "device-check"], capture_output=True, text=True, env=env,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "needs a CUDA GPU" in out.stderr


def _dry(tmp_path, *args):
    (tmp_path / "tmp").mkdir(exist_ok=True)      # a section stopped at its limit leaves its temporary folder here
    env = dict(os.environ, DRY="1", OUT=str(tmp_path), TMPDIR=str(tmp_path / "tmp"))
    out = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--repeats", "1", *args],
                         capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    r = json.loads((tmp_path / "device_check.json").read_text())
    return out, r, (tmp_path / "device_check.md").read_text()


def test_a_section_past_its_limit_is_recorded_and_the_next_one_runs(tmp_path):
    """A middle section that hangs (a cold compile, simulated) stops at its own limit; the sections after it run."""
    out, r, md = _dry(tmp_path, "--sections", "bandwidth,lossless,pass_times", "--hang", "lossless",
                      "--limits", "lossless=2")
    assert out.returncode == 0, out.stderr[-2000:]
    assert r["complete"] and "error" not in r["bandwidth"] and "error" not in r["pass_times"]
    assert r["lossless"]["error"] == "SectionTimeout: timed out after 2 s (its limit)" and not r["passed"]
    assert 2 <= r["lossless_seconds"] < 10 and "Timed out: lossless." in md


def test_pass_times_stopped_at_its_limit_keeps_the_forms_it_finished(tmp_path):
    """pass_times stopped at its limit mid-section (it hangs after its first form) keeps that form's row, names the
    stop, and the projection and table are made from what it finished; the run goes on to the next section."""
    out, r, md = _dry(tmp_path, "--sections", "pass_times,profile", "--hang", "pass_times", "--limits",
                      "pass_times=20")
    assert out.returncode == 0, out.stderr[-2000:]
    assert r["complete"] and "error" not in r["profile"], r
    assert list(r["pass_times"]) == ["tiny"] and list(r["pass_times"]["tiny"]) == ["eager"], r["pass_times"]
    assert r["pass_times_stopped"] == "SectionTimeout: timed out after 20 s (its limit)", r
    assert r["sections"]["pass_times"] == {"status": "stopped", "reason": r["pass_times_stopped"]}
    assert list(r["projection"]["tiny"]) == ["eager"] and "| tiny | eager |" in md
    assert "Stopped at its limit: pass_times (SectionTimeout: timed out after 20 s (its limit))" in md


def test_the_bandwidth_section_lands_its_rows_as_it_measures_them():
    """The bandwidth section's rows go into the dict the run keeps where it stops at its limit (its copy bandwidth,
    each GEMV and attention row as measured), the same object it returns when it finishes (a dry run's shapes)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a dry run's shapes run in the Triton interpreter, which this process does not use")
    from export.tools.device_check import DeviceCheckOptions, bandwidth
    done = {}
    out = bandwidth(DeviceCheckOptions(dry=True, repeats=1), done)
    assert out is done and done["copy_GBps"] > 0 and done["gemv"] and done["attention"], done


def _children(pid: int, name: str) -> list[int]:
    """Process ids of `pid`'s children whose command is `name` (/proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()                     # "pid (comm) state ppid ..."
        except OSError:
            continue                                    # gone meanwhile
        comm, fields = text.split("(", 1)[1].rsplit(")", 1)[0], text.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and comm == name:
            found.append(int(stat.parent.name))
    return found


def test_a_run_killed_in_a_middle_section_leaves_the_sections_done(tmp_path):
    """The whole run's timeout (the script's) fires inside the hanging section: the JSON written after the section
    before it is there, says which section was running, and the table is still printed from it. The timeout fires
    as soon as the hanging section is under way: coreutils' `timeout` treats SIGALRM as its own expiry (timeout.c,
    cleanup()), so the test sends it one then instead of waiting out a fixed number of seconds."""
    env = dict(os.environ, DRY="1", OUT=str(tmp_path), DEVICE_CHECK_TIMEOUT="600")
    proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "device_check.sh"), "--repeats", "1", "--sections",
                             "bandwidth,lossless,pass_times", "--hang", "lossless", "--limits", "lossless=600"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    try:
        seen = read_until(proc.stderr, b"device_check: bandwidth done", seconds=300)
        assert b"bandwidth done" in seen, seen[-2000:]
        report, deadline = tmp_path / "device_check.json", time.time() + 120
        while json.loads(report.read_text()).get("running") != "lossless" and time.time() < deadline:
            time.sleep(0.05)                            # the JSON names the next section just after the line
        timers = _children(proc.pid, "timeout")
        assert len(timers) == 1, timers
        os.kill(timers[0], signal.SIGALRM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    stderr = (seen + stderr).decode()
    assert proc.returncode == 124 and "holds the sections done" in stderr, stderr[-2000:]
    r = json.loads((tmp_path / "device_check.json").read_text())
    assert not r["complete"] and r["running"] == "lossless" and "pass_times" not in r
    assert r["bandwidth"]["copy_GBps"] > 0 and "lossless" not in r
    assert "INCOMPLETE: stopped during `lossless`" in (tmp_path / "device_check.md").read_text()
    assert "INCOMPLETE: stopped during `lossless`" in stdout.decode()


def test_the_7b_shape_is_skipped_below_12_gib():
    from export.tools.device_check import DeviceCheckOptions, _models, seven_b_skip_reason
    orin_8gb, orin_16gb, h200 = 7.4 * 2 ** 30, 15.3 * 2 ** 30, 139 * 2 ** 30
    assert "7.4 GiB" in seven_b_skip_reason(orin_8gb)
    assert seven_b_skip_reason(orin_16gb) is None and seven_b_skip_reason(h200) is None
    assert "llama-2-7b" not in _models(DeviceCheckOptions())              # opt-in: past the default run's 300 s
    assert "llama-2-7b" in _models(DeviceCheckOptions(skip_7b=False))


@pytest.mark.parametrize("args, says", [(["--hang", "lossless"], "dry run only"),
                                        (["--dry", "--limits", "lossless"], "SECTION=SECONDS"),
                                        (["--dry", "--sections", "kernels,warp"], "unknown section 'warp'"),
                                        (["--dry", "--limits", "kernels=0"], "> 0 seconds")])
def test_bad_section_options_are_one_line_errors(args, says):
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-m", "export.commands", "device-check", *args], capture_output=True,
                         text=True, env=env, timeout=120, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and says in out.stderr, out.stderr


def test_a_dry_runs_limits_are_scaled_and_given_limits_are_not():
    """LIMITS budget a GPU's work; a dry run (the interpreter on a CPU, ~4x slower sections on a busy 2-core machine)
    gets DRY_LIMIT_SCALE times them, so a slow CI machine does not time a dry section out; --limits stay as given."""
    from export.tools.device_check import DRY_LIMIT_SCALE, LIMITS, DeviceCheckOptions
    assert DeviceCheckOptions().limit("lossless") == LIMITS["lossless"]
    assert DeviceCheckOptions(dry=True).limit("lossless") == DRY_LIMIT_SCALE * LIMITS["lossless"] >= 60
    assert DeviceCheckOptions(dry=True, limits=(("lossless", 2),)).limit("lossless") == 2


def test_the_default_sections_limits_fit_the_scripts_timeout_of_the_whole_run():
    """The sections a default run holds (all but the opt-in gptq, and tensorrt, whose limit the script adds where
    TensorRT is importable) sum to less than scripts/device_check.sh's timeout of the whole run, so a section that
    runs to its limit still leaves the ones after it theirs (a limit raised without the script's timeout fails)."""
    import re

    from export.tools.device_check import LIMITS, OPT_IN
    whole = int(re.search(r"^WHOLE=(\d+)$", (ROOT / "scripts" / "device_check.sh").read_text(), re.M).group(1))
    default = sum(v for k, v in LIMITS.items() if k not in OPT_IN and k != "tensorrt")
    assert default < whole, (default, whole)
