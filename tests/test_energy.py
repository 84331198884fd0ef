"""Energy meters: tegrastats and jtop parsing on real recorded output, integration, a tegrastats meter fed
by a replay of recorded lines, a source that dies mid-run, and J/token with no meter."""

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from edge.energy import make_meter
from edge.energy.decode_energy import energy_summary, metered_generate
from edge.energy.jtop_meter import power_from_jtop
from edge.energy.power_log import PowerLog, SampledMeter
from edge.energy.tegrastats import TegrastatsMeter, parse_line
from edge.errors import BitNestError

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "tegrastats_orin_8gb.log"    # the docs/energy.md line (Orin Nano/NX 8 GB)
REPLAY = [sys.executable, str(ROOT / "scripts" / "replay_tegrastats.py"), str(RECORDED)]
# A real tegrastats line from a Jetson TX1 (L4T 28), which reports no power rails: hordiales/jetson-tx1-dev, SCRIPTS.md
TX1_LINE = ("RAM 3468/3983MB (lfb 48x4MB) SWAP 873/8192MB (cached 295MB) cpu [17%,13%,29%,5%]@408 EMC 1%@408 "
            "APE 25 GR3D 3%@76")


def test_parse_recorded_orin_line():
    line = parse_line(RECORDED.read_text().splitlines()[0])
    assert line.rails == {"VDD_IN": (4673, 4673), "VDD_CPU_GPU_CV": (527, 527), "VDD_SOC": (1339, 1339)}
    assert (line.ram_used_mb, line.ram_total_mb) == (2272, 7620)
    assert line.total_mw() == (4673.0, "VDD_IN")
    assert line.total_mw("VDD_SOC") == (1339.0, "VDD_SOC")
    with pytest.raises(KeyError, match="VDD_GPU_SOC not on this tegrastats line"):
        line.total_mw("VDD_GPU_SOC")
    assert parse_line(TX1_LINE) is None


def test_jtop_power_dict_uses_instant_not_avg():
    # jetson.power of an Orin NX/Nano (jetson-stats 4.2 shape, docs/energy.md): mV, mA, mW; tot is VDD_IN
    rail = lambda volt, curr, power, avg: {"online": True, "type": "INA3221", "status": "ok", "volt": volt,
                                           "curr": curr, "power": power, "avg": avg, "warn": 32760, "crit": 32760}
    power = {"rail": {"VDD_CPU_GPU_CV": rail(4984, 105, 527, 611), "VDD_SOC": rail(4984, 268, 1339, 1402)},
             "tot": {**rail(5048, 925, 4673, 5120), "name": "VDD_IN"}}
    total, rails = power_from_jtop(power)
    assert total == 4673.0 and rails == {"VDD_CPU_GPU_CV": 527.0, "VDD_SOC": 1339.0}
    with pytest.raises(ValueError, match="without tot.power"):
        power_from_jtop({"rail": {}})


def test_power_log_integrates_trapezoids_and_refuses_uncovered_windows():
    log = PowerLog()
    for i in range(11):                       # p(t) = 1000 + 1000 t mW, sampled every 0.2 s on [0, 2]
        t = 0.2 * i
        log.add(t, 1000.0 + 1000.0 * t)
    r = log.energy(0.25, 1.75)                # exact for a linear power: 1.5 s x 1 W + (1.75^2 - 0.25^2)/2 W s
    assert r.joules == pytest.approx(3.0, rel=1e-12) and r.samples == 7     # t = 0.4 ... 1.6
    missing = log.energy(1.5, 2.5)
    assert missing.joules is None and "do not cover" in missing.reason


class _StepLog(SampledMeter):
    """A tegrastats log with a known power step, replayed at known instants: line i (the recorded Orin line, its
    VDD_IN and VDD_CPU_GPU_CV raised by 5 W while `high(t)`) logged at t = 0.05 + 0.1 i s through the real parser,
    and the session's marks taken from `marks` in order (a meter's clock, scripted so the hand figure is exact).
    `play()` logs the lines, as a live meter would have while the answer ran."""

    name = "tegrastats"
    interval_s = 0.1

    def __init__(self, high, marks):
        self.log, self.marks, self.high = PowerLog(), list(marks), high

    def play(self) -> None:
        high, recorded = self.high, RECORDED.read_text().strip()
        for i in range(61):
            t = 0.05 + 0.1 * i
            line = recorded if not high(t) else recorded.replace("VDD_IN 4673mW/4673mW", "VDD_IN 9673mW/9673mW") \
                .replace("VDD_CPU_GPU_CV 527mW/527mW", "VDD_CPU_GPU_CV 5527mW/5527mW")
            parsed = parse_line(line)
            self.log.add(t, parsed.total_mw()[0], {k: v[0] for k, v in parsed.rails.items()})

    def mark(self) -> float:
        return self.marks.pop(0)


def test_joules_per_token_on_a_known_power_step():
    """Hand-computed J/token of one answer: idle at 4673 mW until 1.5 s, prefill to 2.0 s, decode (draft and verify)
    from its first token at 2.0 s to its last at 4.0 s at 9673 mW (samples at 2.05 ... 3.95 s), 20 tokens, idle after.
    Decode energy by trapezoids, the window's ends interpolated between a 4673 and a 9673 mW sample (7173 mW):
    2 x 0.05 s x (7173 + 9673) / 2 mW + 1.9 s x 9673 mW = 0.84230 + 18.3787 = 19.22100 J, so 0.961050 J/token;
    idle from the idle-tagged samples only (0.05 ... 1.45 s, 4.05 ... 6.05 s: 4.673 W), so above idle
    (19.221 - 4.673 x 2.0) / 20 = 0.493750 J/token. An idle mean that took in a decode sample, a window opened at the
    prefill or closed a sample late, or a phase split off by one sample changes one of the three figures."""
    from edge.engine.stats import DecodeStats
    from edge.energy.session import EnergySession
    meter = _StepLog(high=lambda t: 2.0 < t < 4.0, marks=[2.0, 4.0])
    session = EnergySession(meter)

    def run(on_tokens):                               # what a generation reports, at the instants above
        meter.play()
        session.clock.enter("prefill", 1.5)
        session.clock.enter("draft", 2.0)
        on_tokens([1])                                # the prefill's token opens the decode window (mark 2.0)
        for k in range(19):
            session.clock.enter("verify" if k % 2 else "draft", 2.0 + 0.1 * (k + 1))
        return {"stats": DecodeStats("speculative", "native", tokens=20)}

    _, fig = session.answer(run)                     # closes at mark 4.0 and enters idle there
    session.flush()
    assert fig["joules"] == pytest.approx(19.221, abs=1e-4)
    assert fig["joules_per_token"] == pytest.approx(0.96105, abs=1e-5)
    assert session.idle_watts() == pytest.approx(4.673, abs=1e-9)
    assert fig["joules_per_token_above_idle"] == pytest.approx(0.49375, abs=1e-5)
    assert fig["rails_mw"]["VDD_CPU_GPU_CV"] == 527                       # the last sample of the window, at 4.05 s


def test_tegrastats_meter_on_replayed_lines():
    meter = TegrastatsMeter(interval_ms=50, command=REPLAY + ["--interval-ms", "50"])
    meter.start()
    try:
        t0 = meter.mark()
        time.sleep(0.5)
        t1 = meter.mark()
        r = meter.energy(t0, t1)
    finally:
        meter.stop()
    assert meter.measured == "VDD_IN"
    assert r.samples >= 5, r
    assert r.joules == pytest.approx(4.673 * (t1 - t0), rel=1e-9)       # the recorded line's constant VDD_IN
    assert r.rails == {"VDD_IN": 4673, "VDD_CPU_GPU_CV": 527, "VDD_SOC": 1339}


def test_meter_dying_mid_run_marks_the_figure_unavailable(rtn_checkpoint):
    from edge.decode.config import GenerateConfig
    from edge.llm import Runtime
    rt = Runtime(rtn_checkpoint, backend="torch", max_context=256)     # torch: no re-layout at load
    ids = rt.encode("Write a short poem about the sea.")
    meter = make_meter("tegrastats", 50, REPLAY + ["--interval-ms", "50", "--exit-after", "4", "--exit-code", "3"])
    try:
        stats, reading = metered_generate(rt.engine, ids, GenerateConfig(policy="target", max_new_tokens=6),
                                          set(), meter)
    finally:
        meter.stop()
    assert stats.tokens == 5                                # the run completes
    assert reading.joules is None
    assert "stopped after 4 readings (exit code 3)" in reading.reason, reading.reason
    summary = energy_summary([reading], stats.tokens, None)
    assert summary["joules_per_token"] is None and "exit code 3" in summary["reason"]


def test_no_meter_here_says_why():
    meter = make_meter("auto")
    if meter.name != "none":
        pytest.skip(f"this machine has a working {meter.name} meter")
    for name in ("tegrastats", "jtop", "nvml"):
        assert name in meter.reason
    r = meter.energy(0.0, 1.0)
    assert r.joules is None and r.reason == meter.reason
    if shutil.which("tegrastats") is None:
        with pytest.raises(BitNestError, match="--meter tegrastats is not available here"):
            make_meter("tegrastats")


def test_joules_per_token_script_with_no_meter(rtn_checkpoint, capsys):
    sys.path.insert(0, str(ROOT / "scripts"))
    import joules_per_token
    rc = joules_per_token.main(["--checkpoint", str(rtn_checkpoint), "--meter", "none", "--policy", "target",
                                "--prompts", "1", "--max-new-tokens", "6", "--idle-seconds", "0.1", "--backend", "torch",
                                "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    target = out["policies"]["target"]
    assert target["tokens"] == 5 and target["tok_s"] > 0
    assert target["joules_per_token"] is None and target["reason"] == "no meter requested (--meter none)"
    assert out["idle"]["watts"] is None


@pytest.mark.jetson
def test_tegrastats_on_a_jetson():
    if shutil.which("tegrastats") is None:
        pytest.skip("tegrastats is not on PATH: not a Jetson")
    meter = make_meter("tegrastats", 100)
    try:
        t0 = meter.mark()
        time.sleep(1.0)
        r = meter.energy(t0, meter.mark())
    finally:
        meter.stop()
    assert r.joules is not None and 0.5 < r.watts < 80, r


@pytest.mark.gpu
def test_nvml_energy_counter():
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    from edge.energy.nvml import NvmlMeter
    why = NvmlMeter.unavailable_reason()
    if why:
        pytest.skip(why)
    meter = make_meter("nvml")
    try:
        t0 = meter.mark()
        time.sleep(0.5)
        r = meter.energy(t0, meter.mark())
    finally:
        meter.stop()
    assert r.joules is not None and r.watts > 1.0, r


def test_phase_clock_tags_each_instant():
    from edge.energy.session import PhaseClock
    c = PhaseClock("idle")
    for t, phase in ((1.0, "prefill"), (2.0, "draft"), (3.0, "verify"), (3.5, "verify"), (4.0, "idle")):
        c.enter(phase, t)
    assert [c.phase_at(t) for t in (0.5, 1.0, 1.5, 2.5, 3.2, 3.9, 4.5)] == \
        ["idle", "prefill", "prefill", "draft", "verify", "verify", "idle"]
    with pytest.raises(ValueError, match="unknown phase 'decode'"):
        c.enter("decode")


def test_engine_reports_each_pass_phase(rtn_checkpoint):
    from edge.decode.config import GenerateConfig
    from edge.llm import Runtime
    rt = Runtime(rtn_checkpoint, backend="cpu", max_context=256)
    seen = []
    rt.engine.on_phase = seen.append
    rt.generate(rt.encode("Name a color."), GenerateConfig(policy="speculative", gamma=2, max_new_tokens=5))
    assert seen[0] == "prefill" and set(seen[1:]) == {"draft", "verify"}, seen


def _chat(*args):
    import subprocess
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "chat.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=600)


def _prompts(tmp_path) -> Path:
    f = tmp_path / "prompts.jsonl"
    f.write_text(json.dumps({"prompt": "Name a color."}) + "\n" + json.dumps({"prompt": "Say hello."}) + "\n")
    return f


def test_chat_meters_each_answer_and_logs_every_sample_with_its_phase(rtn_checkpoint, tmp_path):
    """Real recorded tegrastats lines replayed every 5 ms: J/token per answer from the constant VDD_IN (4673 mW),
    idle measured first, every sample appended to the energy log with its phase."""
    import shlex
    log = tmp_path / "energy.jsonl"
    # speculative, not the chat's default auto (which on a CPU may choose target steps only): draft passes to tag.
    # Samples every 5 ms over 48-token answers: with the native step a verification pass takes a few ms, and 8 tokens
    # sampled every 20 ms could leave no sample inside any verification (seen in CI)
    r = _chat("--checkpoint", rtn_checkpoint, "--prompts-file", _prompts(tmp_path), "--max-new-tokens", "48",
              "--policy", "speculative", "--meter", "tegrastats", "--interval-ms", "5", "--idle-seconds", "0.2",
              "--meter-command", shlex.join(REPLAY + ["--interval-ms", "5"]), "--energy-log", log, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for res in out["results"] + [{"stats": out["stats"]}]:
        s = res["stats"]
        assert s["meter"] == "tegrastats" and s["energy_reason"] is None, s
        assert s["mean_power_w"] == pytest.approx(4.673, rel=1e-6)
        assert s["joules_per_token"] == pytest.approx(s["joules"] / s["tokens"], rel=1e-3)
        assert s["joules_per_token_above_idle"] == pytest.approx(0.0, abs=1e-4)      # constant power: none above idle
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    phases = {x["phase"] for x in lines}
    assert phases <= {"prefill", "draft", "verify", "idle"} and {"draft", "verify", "idle"} <= phases, phases
    assert all(x["mw"] == 4673.0 and x["rails"]["VDD_SOC"] == 1339 and x["meter"] == "tegrastats" for x in lines)
    assert [x["t"] for x in lines] == sorted(x["t"] for x in lines) and {x["answer"] for x in lines} == {0, 1, 2}


def test_chat_goes_on_when_the_meter_dies(rtn_checkpoint, tmp_path):
    """The meter dies after 3 readings (~60 ms after it starts); the chat's idle window (1 s, before any answer) lets
    it die first however fast the answers are (with the native step, two 6-token answers took less than its life)."""
    import shlex
    r = _chat("--checkpoint", rtn_checkpoint, "--prompts-file", _prompts(tmp_path), "--max-new-tokens", "6",
              "--meter", "tegrastats", "--interval-ms", "20", "--idle-seconds", "1",
              "--meter-command", shlex.join(REPLAY + ["--interval-ms", "20", "--exit-after", "3", "--exit-code", "3"]),
              "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(out["results"]) == 2 and all(res["tokens"] for res in out["results"])
    for res in out["results"]:
        assert res["stats"]["joules_per_token"] is None
        assert "stopped after 3 readings (exit code 3)" in res["stats"]["energy_reason"]
    assert r.stderr.count("the power meter stopped") == 1 and "Traceback" not in r.stderr, r.stderr


def test_chat_without_a_meter_says_why(rtn_checkpoint):
    r = _chat("--checkpoint", rtn_checkpoint, "--prompt", "Say hello.", "--max-new-tokens", "4", "--meter", "none",
              "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
    assert s["meter"] == "none" and s["joules_per_token"] is None
    assert s["energy_reason"] == "no meter requested (--meter none)" and s["tok_s"] > 0
