"""scripts/chat.py: JSON output shapes, prompts files, and one-line errors for bad input; Ctrl-C exits cleanly."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT, command_here, policy_backend, read_until


def _chat(*args, **kw):
    return subprocess.run([sys.executable, "scripts/chat.py", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=600, **kw)


def test_one_prompt_json(rtn_checkpoint):
    r = _chat("--checkpoint", rtn_checkpoint, "--prompt", "Say hello.", "--max-new-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert isinstance(out["text"], str) and 1 <= len(out["tokens"]) <= 8
    for key in ("acceptance", "tokens_per_round", "tok_s", "weight_bytes_per_token", "kv_bytes_per_token",
                "policy", "backend"):
        assert key in out["stats"], key
    from edge.backends import resolve_backend
    assert out["stats"]["policy"] == "auto" and out["stats"]["backend"] == resolve_backend("auto")
    s = out["stats"]
    assert list(s["cost_table"]["target_ms"]) == [str(w) for w in range(1, 10)] and s["cost_table"]["source"] in \
        ("measured", "cache") and sum(s["gamma_histogram"].values()) == s["target_passes"]


def test_prompts_file_json(rtn_checkpoint, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "Name a color."}) + "\n" +
                 json.dumps({"prompt": "To be, or not to be,", "chat": False}) + "\n")
    r = _chat("--checkpoint", rtn_checkpoint, "--prompts-file", f, "--max-new-tokens", "6", "--policy", "target", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(out["results"]) == 2 and out["stats"]["policy"] == "target" and out["stats"]["acceptance"] is None


def test_auto_costs_a_ceiling_a_spoiled_table_and_a_remeasure(rtn_checkpoint, tmp_path, capsys, monkeypatch):
    """--gamma caps auto's choice; a corrupt cached table is re-measured with one line on stderr; --remeasure-costs
    measures though a sound table is cached (a private cache folder for the tables, the native step built already
    linked into it: its passes measure in a second where the cpu backend's take twenty). The first run in a process
    of its own, the next through the same entry point in this one."""
    from edge.cache import cache_root
    from edge.engine import costs
    (tmp_path / "native").symlink_to(cache_root() / "native", target_is_directory=True)
    env = {**os.environ, "BITNEST_CACHE": str(tmp_path)}
    backend = policy_backend()
    args = ("--checkpoint", rtn_checkpoint, "--backend", backend, "--prompt", "Name three rivers.", "--max-new-tokens",
            "12", "--json")
    r = _chat(*args, "--gamma", "2", env=env)
    monkeypatch.setenv("BITNEST_CACHE", str(tmp_path))
    run = lambda *a: command_here(capsys, "chat", *args, *a)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    s = json.loads(r.stdout.splitlines()[-1])["stats"]
    path = Path(s["cost_table"]["path"])
    assert s["cost_table"]["source"] == "measured" and path.is_relative_to(tmp_path) and path.is_file()
    assert max(map(int, s["gamma_histogram"])) <= 2
    path.write_text("{half a table")
    r = run()
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == [f"auto: the cost table {path} is unreadable (JSONDecodeError): re-measured"]
    assert json.loads(r.stdout.splitlines()[-1])["stats"]["cost_table"]["source"] == "measured"
    for flags, source in (((), "cache"), (("--remeasure-costs",), "measured")):
        r = run(*flags)
        table = json.loads(r.stdout.splitlines()[-1])["stats"]["cost_table"]
        if not flags and table["source"] == "measured":      # the spot check found this host's passes out of step
            assert r.returncode == 0 and len(r.stderr.splitlines()) == 1, r.stderr    # with the table (a burst of
            assert r.stderr.startswith(f"auto: the cost table {path} is out of step"), r.stderr  # load): one line
            continue
        assert r.returncode == 0 and r.stderr == "", r.stderr
        checked = source == "cache" and backend in costs.CHECKED_BACKENDS     # spot-checked where it was read
        assert table["source"] == source and ("check" in table) == checked, (flags, table)


def test_the_answer_line_shows_the_gamma_mix():
    from export.commands.chat import answer_line
    s = {"tokens": 30, "tok_s": 99.0, "acceptance": 0.75, "tokens_per_round": 2.5, "escalation_rate": None,
         "gamma_histogram": {"0": 6, "4": 6}}
    assert answer_line(s).endswith("acceptance 75%, 2.5 tok/round, γ 0×6 4×6]")
    assert "γ" not in answer_line({**s, "gamma_histogram": None})


def _one_line_error(r, needle):
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_bad_input_errors(rtn_checkpoint, tmp_path, capsys):
    _one_line_error(_chat("--checkpoint", tmp_path / "none", "--prompt", "x"), "does not exist")
    old = tmp_path / "old"
    shutil.copytree(rtn_checkpoint, old)
    m = json.loads((old / "manifest.json").read_text())
    m["format_version"] = 0
    (old / "manifest.json").write_text(json.dumps(m))
    chat = lambda *args: command_here(capsys, "chat", *args)     # the real run above checks the process's exit
    _one_line_error(chat("--checkpoint", old, "--prompt", "x"), "format version 0")
    _one_line_error(chat("--checkpoint", rtn_checkpoint, "--prompt", "x", "--policy", "fast"), "unknown policy 'fast'")
    _one_line_error(chat("--checkpoint", rtn_checkpoint, "--prompt", "x", "--backend", "npu"), "unknown backend 'npu'")
    _one_line_error(chat("--checkpoint", rtn_checkpoint, "--prompt", "x", "--gamma", "12"),
                    "auto chooses γ in 0..8 from the measured pass costs: its ceiling (--gamma) must be in [1, 8]")
    _one_line_error(chat("--checkpoint", rtn_checkpoint, "--prompt", "word " * 100, "--max-context", "32"),
                    "does not fit the KV cache of 32")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": 1}\n')
    _one_line_error(chat("--checkpoint", rtn_checkpoint, "--prompts-file", bad), "bad.jsonl:1")


def _wait_blocked_reading(pid: int, seconds: float = 30) -> None:
    """Until the process's main thread sleeps in a pipe read (its prompt's input()): a SIGINT that lands between
    the prompt's write and the read is handled before the read starts, and the read then waits for input, as a
    user typing Ctrl-C within microseconds of the prompt would see. Where /proc gives no wait channel, 2 s."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            wchan = Path(f"/proc/{pid}/wchan").read_text()
        except OSError:
            wchan = ""
        if wchan in ("", "0"):
            time.sleep(2)
            return
        if "pipe" in wchan:
            return
        time.sleep(0.05)


def test_interactive_chat_streams_and_ctrl_c_at_the_prompt_ends_it(rtn_checkpoint):
    """Ctrl-C at the prompt ends the chat with exit 0 and no traceback, with stdin left open (a pipe never closed):
    only the SIGINT can end it (end of input would end it too, so closing stdin would prove nothing). SIGINT is
    set to its default in the child, as a terminal gives it (a background shell launches children with it ignored)."""
    p = subprocess.Popen([sys.executable, "scripts/chat.py", "--checkpoint", str(rtn_checkpoint), "--max-new-tokens",
                          "6"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        p.stdin.write(b"Hello!\n")
        p.stdin.flush()
        err = read_until(p.stderr, b"tok/s")
        assert b"tok/s" in err, err[-2000:]
        out = read_until(p.stdout, b"bot> ")
        out += read_until(p.stdout, b"you> ") if out.count(b"you> ") < 2 else b""   # the answer, then the prompt
        assert b"bot> " in out and out.rstrip().endswith(b"you>"), out
        _wait_blocked_reading(p.pid)
        p.send_signal(signal.SIGINT)
        try:
            code = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("SIGINT at the prompt did not end the chat") from None
        rest = p.stderr.read()
        assert not p.stdin.closed and code == 0 and b"Traceback" not in err + rest, (err + rest)[-2000:]
    finally:
        if p.poll() is None:
            p.kill()
        p.stdin.close()
