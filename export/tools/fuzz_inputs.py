"""`bitnest fuzz-inputs` (scripts/fuzz_inputs.py): every reader fuzzed (edge.analysis.fuzz.readers), command-line
values fuzzed through the command table, and exports killed mid-write or run out of disk (a small tmpfs, as root)
with an earlier checkpoint at the same path, which must stay loadable. Prints the counts as one JSON object.

    python scripts/fuzz_inputs.py --checkpoint DIR [--cases N] [--seed S] [--export-model HF_FOLDER|default]
                                  [--kills K] [--readers manifest,weights,...] [--work DIR] [--json]
"""

import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edge.analysis.fuzz import readers as R
from edge.analysis.fuzz.mutations import OUTCOMES, Hang, Tally, time_limit
from edge.model.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
READERS = ("manifest", "weights", "prompts", "thresholds", "tegrastats", "onnx", "cli")
NUMBERS = ["-1", "0", "1", "3", "17", "2.5", "1e9", "nan", "inf", "-inf", "", "abc", "99999999999999999999", "0x10",
           " 5", "1_0", "-0", "1e-30"]


def cli_cases(ck: Path, work: Path) -> list[tuple[list[str], str, list[str]]]:
    """(valid argv, the option to mutate, values to try) for the commands whose options a user types most."""
    prompts = work / "ok.jsonl"
    prompts.write_text('{"prompt": "Hi."}\n')
    words = ["", "x", "/nonexistent", "/dev/null", "/", str(prompts), str(ck), "-1", "é"]
    chat = ["chat", "--checkpoint", str(ck), "--prompt", "Hi.", "--max-new-tokens", "2", "--max-context", "64",
            "--json"]
    chat_opts = {"--gamma": NUMBERS, "--temperature": NUMBERS, "--top-k": NUMBERS, "--top-p": NUMBERS,
                 "--seed": NUMBERS, "--max-context": NUMBERS, "--kv8-draft-below": NUMBERS, "--recent": NUMBERS,
                 "--max-new-tokens": NUMBERS, "--gate-rate": NUMBERS, "--gate-threshold": NUMBERS,
                 "--adaptive-stop": NUMBERS, "--gamma-max": NUMBERS, "--policy": ["", "fast", "gate-entropy",
                 "gate-phase", "adaptive", "draft"], "--backend": ["", "npu", "torch", "tensorrt", "onnxruntime"],
                 "--long-draft-kv": ["", "kv2", "recent"], "--device": ["", "orin", "local", "cuda"],
                 "--prompt": ["", " ", "\u0000", "x" * 5000], "--prompts-file": words, "--checkpoint": words,
                 "--stop": ["", "x"], "--phase-order": ["", "up"]}
    mc = ["max-context", "--device", "orin-nx-8gb", "--model", str(ck), "--json"]
    mc_opts = {"--device": ["", "orin-nx-32gb", "local", "cuda"], "--model": words + ["llama-3-8b"],
               "--gamma": NUMBERS, "--prefill-chunk": NUMBERS, "--total-mib": NUMBERS, "--os-reserve-mib": NUMBERS,
               "--context-reserve-mib": NUMBERS, "--backend": ["", "cpu", "gpu", "torch"]}
    jl = ["joules", "--checkpoint", str(ck), "--meter", "none", "--prompts", "1", "--max-new-tokens", "2",
          "--idle-seconds", "0", "--json"]
    jl_opts = {"--meter": ["", "tegrastats", "watt"], "--policy": ["", "target,fast", ",", "gate-entropy"],
               "--prompts": NUMBERS, "--max-new-tokens": NUMBERS, "--idle-seconds": NUMBERS,
               "--interval-ms": NUMBERS, "--rail": ["", "VDD_X"], "--meter-command": ["", "false", "/nonexistent"]}
    out = []
    for base, opts in ((chat, chat_opts), (mc, mc_opts), (jl, jl_opts)):
        out += [(base, opt, values) for opt, values in opts.items()]
    return out


def run_command_quietly(argv: list[str]) -> tuple[int | None, str, str]:
    """(exit code, stdout, stderr) of `bitnest ARGV` in this process; an exception escapes as it would."""
    from export.commands import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:        # argparse: usage line and `prog: error: ...`
            rc = e.code if isinstance(e.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


def fuzz_cli(ck: Path, work: Path, n: int, rng: random.Random, seconds: float) -> Tally:
    """One option value changed per case. Clear error: exit code != 0 and stderr's last line `prog: error: ...`
    with no traceback; accepted: exit 0 and the --json line parses."""
    t, cases = Tally(), cli_cases(ck, work)
    for i in range(n):
        base, opt, values = rng.choice(cases)
        argv = [a for a in base]
        value = rng.choice(values)
        if opt in argv:
            argv[argv.index(opt) + 1] = value
        else:
            argv += [opt, value]
        label = f"cli case {i}: {' '.join(argv[:1] + [opt, repr(value)])}"
        try:
            with time_limit(seconds):
                rc, out, err = run_command_quietly(argv)
        except Hang:
            t.add("hang", label)
            continue
        except Exception as e:    # noqa: BLE001
            t.add("crash", f"{label}: {e.__class__.__name__}: {e}")
            continue
        last = (err.strip().splitlines() or [""])[-1]
        if "Traceback" in err:
            t.add("crash", f"{label}: traceback {err[-300:]!r}")
        elif rc != 0:
            t.add("error" if ": error: " in last or last.endswith("interrupted") else "crash", f"{label}: {err!r}")
        else:
            try:
                json.loads(out.strip().splitlines()[-1])
                t.add("accepted", label)
            except (ValueError, IndexError):
                t.add("wrong", f"{label}: exit 0 without its JSON line")
    return t


# -- exports killed or out of disk --------------------------------------------------------------------------------
def _export_cmd(model: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "export.commands", "export", "--model", model, "--out", str(out), "--method", "rtn",
            "--rotation", "none", "--json"]


def _same_as(path: Path, manifest: dict) -> bool:
    try:
        return load_checkpoint(path).manifest == manifest
    except Exception:     # noqa: BLE001 -- not loadable at all
        return False


def killed_exports(earlier: Path, model: str, work: Path, kills: int, rng: random.Random) -> dict:
    """Export over an earlier checkpoint and kill -9 the export at a random moment, `kills` times: the path must
    hold a loadable checkpoint every time (the earlier one, or the new one where the export had finished)."""
    counts = {"earlier_intact": 0, "new_complete": 0, "broken": 0}
    want = load_checkpoint(earlier).manifest
    t0 = time.time()
    p = subprocess.run(_export_cmd(model, work / "probe"), capture_output=True, text=True, cwd=ROOT)
    took = time.time() - t0
    if p.returncode != 0:
        return {"skipped": f"the export itself fails: {p.stderr.strip().splitlines()[-1:]}"}
    for _ in range(kills):
        out = work / "killed"
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(earlier, out)
        proc = subprocess.Popen(_export_cmd(model, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd=ROOT)
        time.sleep(rng.uniform(0.3, 1.1) * took)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if _same_as(out, want):
            counts["earlier_intact"] += 1
        else:
            try:
                load_checkpoint(out)
                counts["new_complete"] += 1
            except Exception:     # noqa: BLE001
                counts["broken"] += 1
    return {**counts, "export_seconds": round(took, 1)}


def disk_full_export(earlier: Path, model: str, work: Path) -> dict:
    """An export over an earlier checkpoint on a tmpfs with room for it and half another: the export must fail
    with a one-line error and leave the earlier checkpoint as it was (root only: it mounts the tmpfs)."""
    if os.geteuid() != 0:
        return {"skipped": "needs root to mount a small tmpfs"}
    from plugins.step_contract import ONNX_FILE
    graph = shutil.ignore_patterns(ONNX_FILE + "*")      # an export writes no graph: room for the checkpoint alone
    size = sum(f.stat().st_size for f in earlier.iterdir() if not f.name.startswith(ONNX_FILE))
    mnt = work / "tmpfs"
    mnt.mkdir(exist_ok=True)
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size * 3 // 2 + (1 << 20)}", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if m.returncode != 0:
        return {"skipped": f"mount failed: {m.stderr.strip()[:200]}"}
    try:
        out = mnt / "ckpt"
        shutil.copytree(earlier, out, ignore=graph)
        want = load_checkpoint(out).manifest
        p = subprocess.run(_export_cmd(model, out), capture_output=True, text=True, cwd=ROOT)
        lines = p.stderr.strip().splitlines()
        return {"exit_code": p.returncode, "stderr_last_line": lines[-1] if lines else "",
                "one_line_error": p.returncode != 0 and "Traceback" not in p.stderr,
                "earlier_intact": _same_as(out, want),
                "leftovers": sorted(f.name for f in mnt.iterdir() if f.name != "ckpt")}
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def run(a) -> dict:
    ck = Path(a.checkpoint)
    load_checkpoint(ck)                                         # a one-line error if the subject itself is bad
    readers = [r for r in a.readers.split(",") if r]
    bad = [r for r in readers if r not in READERS]
    if bad or a.cases < 1 or a.seconds <= 0:
        raise ValueError(f"readers must be among {', '.join(READERS)}, --cases >= 1, --seconds > 0")
    work = Path(a.work or tempfile.mkdtemp(prefix="bitnest-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    subject = R.fuzz_copy(ck, work)
    if "onnx" in readers:                               # a fresh graph, with the sha256 the export writes beside it
        from export.onnx.graph import export_onnx
        export_onnx(subject)
    out = {"checkpoint": str(ck), "cases_per_reader": a.cases, "seed": a.seed, "readers": {}}
    for r in readers:
        rng = random.Random(f"{a.seed}-{r}")
        t1 = time.time()
        if r == "manifest":
            tally = R.fuzz_manifest(subject, work, a.cases, rng, a.seconds)
        elif r == "weights":
            tally = R.fuzz_weights(subject, work, a.cases, rng, a.seconds)
        elif r == "prompts":
            tally = R.fuzz_prompts(work, a.cases, rng, a.seconds)
        elif r == "thresholds":
            tally = R.fuzz_thresholds(subject, work, a.cases, rng, a.seconds)
        elif r == "tegrastats":
            tally = R.fuzz_tegrastats(ROOT / "tests" / "data" / "tegrastats_orin_8gb.log", a.cases, rng, a.seconds)
        elif r == "onnx":
            tally = R.fuzz_onnx(subject, work, a.cases, rng, a.seconds)
        else:
            tally = fuzz_cli(subject, work, a.cases, rng, a.seconds)
        out["readers"][r] = {**tally.counts, "seconds": round(time.time() - t1, 1), "examples": tally.examples}
    totals = {k: sum(v[k] for v in out["readers"].values()) for k in OUTCOMES + ("valid",)}
    out["totals"] = totals
    if a.kills:
        out["killed_exports"] = killed_exports(subject, a.export_model, work, a.kills, random.Random(a.seed))
        out["disk_full_export"] = disk_full_export(subject, a.export_model, work)
    out["seconds"] = round(time.time() - t0, 1)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return out
