"""The device check's opt-in `gptq` section (--with-gptq): the export's GPTQ on CUDA gives the CPU export's quality.
It exports the default model with the default options and `--device cuda` (scripts/export.py) into a temporary
folder, evaluates it with the command and token count behind the committed CPU figures (README's headline row
"draft / target agreement of the default export": scripts/results/quality.json, row DEFAULT_ROW,
`python scripts/quality_table.py --tokens 4096`, whose evaluation scripts/evaluate.py repeats), and passes where every
corpus's draft/target agreement is within TOLERANCE_POINTS of the committed figure.

Both steps are the repo's own commands (`python -m export.commands export | evaluate`) in processes of their own
(a crash or a hang of either is the section's, never the check's), bounded together by
the section's limit: the child under way is stopped GPTQ_STOP_MARGIN seconds before it, and the section fails naming
the step and keeping the child's last output lines. A dry run (--dry) runs the same path on the CPU with a tiny
calibration, RTN in place of GPTQ, and few tokens: its figures are not the CPU export's, so its verdict is PLUMBING,
neither pass nor fail.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUALITY = ROOT / "scripts" / "results" / "quality.json"
# The committed row of the default export and the command README's headline row names for it (edge.analysis.report.tables,
# names it too: tests/test_device_gptq.py holds the two equal)
DEFAULT_ROW = "bitnest closed, trust 0.1 + rot + nested head, draft head 8bit (default)"
CPU_COMMAND = "python scripts/quality_table.py --tokens 4096"
CPU_TOKENS = 4096             # that command's --tokens: the committed row counts 4 windows of 1024, 4 x 1023 = 4092
# The bound. GPTQ on CUDA sums float32 in another order, so a code on a rounding edge may move by one step
# (> 99% of codes agree: tests/test_export_resume.py); 0.5 points is ~20 of each corpus's 4,092 argmax decisions.
TOLERANCE_POINTS = 0.5
GPTQ_STOP_MARGIN = 2.0        # seconds before the section's limit at which the child under way is stopped
TAIL_LINES = 12               # a child's last output lines kept in the JSON
# the dry run's export: RTN (~10 s on 2 cores; the plumbing is the section's, GPTQ on the CPU is the suite's own
# tests/test_export_e2e.py), a tiny calibration for what the export still calibrates
DRY_EXPORT = ("--method", "rtn", "--calib-samples", "2", "--calib-seq-len", "32")
DRY_TOKENS = 64               # the dry run's evaluation tokens per corpus
PLUMBING = "dry: plumbing only"
EXPORT = (sys.executable, "-m", "export.commands", "export")          # `bitnest export` in a child process
EVALUATE = (sys.executable, "-m", "export.commands", "evaluate")


def committed(path: Path = QUALITY) -> dict:
    """The default export's committed CPU evaluation: its per-corpus agreement and counted tokens, and the evaluation
    options that produced them."""
    ev = json.loads(Path(path).read_text())[DEFAULT_ROW]["eval"]
    return {"row": DEFAULT_ROW, "source": str(Path(path).relative_to(ROOT)) if Path(path).is_relative_to(ROOT)
            else str(path), "command": CPU_COMMAND, "agreement": ev["agreement"], "tokens": ev["tokens"],
            "window": ev["window"], "backend": ev["backend"], "draft_head": ev["draft_head"],
            "act": "float" if ev["activations"] == "float32" else "int8"}


def export_command(out: Path, dry: bool, program: tuple = EXPORT) -> list:
    """The default model, the default method and options, GPTQ on CUDA (when dry: the CPU, RTN, a tiny calibration)."""
    return [*program, "--out", str(out), "--device", "cpu" if dry else "cuda", "--json", *(DRY_EXPORT if dry else ())]


def evaluate_command(checkpoint: Path, cpu: dict, tokens: int, program: tuple = EVALUATE) -> list:
    """The evaluation behind the committed figures (quality_table's: backend, window, activations, draft head)."""
    return [*program, "--checkpoint", str(checkpoint), "--tokens", str(tokens), "--window", str(cpu["window"]),
            "--backend", cpu["backend"], "--act", cpu["act"], "--draft-head", cpu["draft_head"], "--json"]


def compare(measured: dict, cpu: dict, tolerance: float = TOLERANCE_POINTS) -> dict:
    """Per corpus of the committed figures: {"committed" (the CPU export's), "measured" (this export's), as
    fractions, "difference_points", "within"}; a corpus the evaluation did not report is not within."""
    out = {}
    for corpus, ref in cpu.items():
        got = measured.get(corpus)
        diff = None if got is None else round(100 * (got - ref), 4)      # points; rounded: 0.5 stays 0.5
        out[corpus] = {"committed": ref, "measured": got, "difference_points": diff,
                       "within": diff is not None and abs(diff) <= tolerance}
    return out


def _lines(text: str) -> list:
    return [line.strip() for line in re.split(r"[\r\n]+", text or "") if line.strip()]     # tqdm redraws with \r


def run_child(cmd: list, deadline: float) -> dict:
    """cmd from the repo root until `deadline` (time.monotonic()): {"rc", "timed_out", "seconds", "stdout",
    "tail"}; stopped at the deadline (killed; the output it had written is kept). A child left running when this
    returns early (SectionTimeout, KeyboardInterrupt) is killed too."""
    t0 = time.monotonic()
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    timed_out = False
    try:
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - t0))
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            out, err = proc.communicate()          # what it wrote before it was stopped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"rc": proc.returncode, "timed_out": timed_out, "seconds": round(time.monotonic() - t0, 1),
            "stdout": out or "", "tail": (_lines(err) + _lines(out))[-TAIL_LINES:]}


def _last_json(text: str) -> dict | None:
    try:
        got = json.loads(_lines(text)[-1])
    except (IndexError, ValueError):
        return None
    return got if isinstance(got, dict) else None


def _step(r: dict, step: str, run: dict, limit: float) -> dict | None:
    """Record a finished child under r[step]; its JSON, or None with r failed (timed out, exit status, no JSON)."""
    r[step] = {"wall_seconds": run["seconds"], "rc": run["rc"], "tail": run["tail"]}
    got = None if run["timed_out"] else _last_json(run["stdout"])
    if got is None:
        last = run["tail"][-1] if run["tail"] else "no output"
        why = (f"timed out after {limit - GPTQ_STOP_MARGIN:g} s (the section's limit {limit:g} s less "
               f"{GPTQ_STOP_MARGIN:g}) in the {step}" if run["timed_out"] else f"the {step} exited {run['rc']}")
        r.update(status="failed", passed=False, reason=f"{why}: {last[:300]}")
    return got


def gptq_section(limit: float, dry: bool = False, export_program: tuple = EXPORT, quality: Path = QUALITY) -> dict:
    """The export on CUDA (the CPU when dry) against the committed CPU figures: {"status" (passed / failed /
    PLUMBING), "passed", "corpora" (per corpus: both figures, the difference in points, within), "export" (its
    seconds, peak resident bytes), "evaluation", "device", "commands", "committed"}; on a timeout or a failed step,
    "reason" names the step and its last line, and the step's "tail" keeps its last lines."""
    deadline = time.monotonic() + max(1.0, limit - GPTQ_STOP_MARGIN)
    cpu = committed(quality)
    r = {"status": "running", "dry": dry, "device": "cpu" if dry else "cuda", "tolerance_points": TOLERANCE_POINTS,
         "committed": {k: cpu[k] for k in ("source", "row", "command", "agreement", "tokens")}}
    if not dry:
        import torch
        r["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    with tempfile.TemporaryDirectory(prefix="bitnest-gptq-") as tmp:
        ckpt = Path(tmp) / "ckpt"
        cmds = {"export": export_command(ckpt, dry, export_program),
                "evaluation": evaluate_command(ckpt, cpu, DRY_TOKENS if dry else CPU_TOKENS)}
        r["commands"] = {k: shlex.join(v) for k, v in cmds.items()}
        summary = _step(r, "export", run_child(cmds["export"], deadline), limit)
        if summary is None:
            return r
        memory = summary.get("memory", {})
        r["export"].update(seconds=summary.get("seconds"), peak_rss_bytes=memory.get("measured_peak"),
                           planned_peak_bytes=memory.get("planned_peak"), bytes=summary.get("bytes"))
        ev = _step(r, "evaluation", run_child(cmds["evaluation"], deadline), limit)
        if ev is None:
            return r
    r["evaluation"].update(seconds=ev.get("seconds"), tokens=ev.get("tokens"))
    r.update(judge(ev, cpu, dry))
    return r


def judge(ev: dict, cpu: dict, dry: bool = False) -> dict:
    """The verdict on an evaluation's JSON against the committed figures (`committed()`): {"corpora" (compare's),
    "status", "passed", "reason"}. Failed where a corpus is past the bound, or where the evaluation counted other
    tokens than the committed one (not the same evaluation); PLUMBING, with no pass or fail, in a dry run."""
    corpora = compare(ev.get("agreement") or {}, cpu["agreement"])
    if dry:                      # an RTN export is not the CPU export's: the figures show the plumbing only
        return {"corpora": corpora, "status": PLUMBING, "passed": None, "reason": None}
    counted = ev.get("tokens") or {}
    other = [c for c in cpu["tokens"] if counted.get(c) != cpu["tokens"][c]]
    off = [c for c, v in corpora.items() if not v["within"]]
    if other:
        reason = (f"not the committed evaluation: {other[0]} counted {counted.get(other[0])} tokens, the committed "
                  f"figure {cpu['tokens'][other[0]]}")
    elif off:
        reason = "; ".join(f"{c} {corpora[c]['difference_points']} points from the CPU export" for c in off) \
            + f" (bound {TOLERANCE_POINTS:g})"
    else:
        reason = None
    return {"corpora": corpora, "status": "failed" if reason else "passed", "passed": not reason, "reason": reason}
