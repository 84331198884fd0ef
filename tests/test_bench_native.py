"""The bench beside llama.cpp built for this CPU (edge.analysis.bench.llamacpp) and the prefill it is set against:
the build's refusal where a tool is missing, llama-bench's command line and its JSON read back (a stand-in tool that
replays a recorded llama-bench run on the default model's Q8_0), and --passes-only timing a prefill in the runner's
process. The build itself (~10 min on 2 cores) and the peer's figures are the benchmark's (docs/runtime.md)."""

import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from edge.analysis.bench import llamacpp as native
from edge.errors import BitNestError

RECORDED = Path(__file__).parent / "data" / "llama-bench-smollm2-135m-q8_0.json"


def _which_without(*absent):
    return lambda tool: None if tool in absent else f"/usr/bin/{tool}"


@pytest.mark.parametrize("absent, named", [(("ninja",), "ninja"), (("cmake",), "cmake"),
                                           (("c++", "g++", "clang++"), "a C++ compiler")])
def test_a_missing_build_tool_is_named_in_one_line(tmp_path, monkeypatch, absent, named):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(native.shutil, "which", _which_without(*absent))
    assert [m.split(" (")[0] for m in native.missing_tools()] == [named]
    with pytest.raises(BitNestError) as e:
        native.ensure_built(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and named in msg and "apt-get install" in msg
    assert not any(tmp_path.iterdir())                         # nothing half-built left behind


def test_a_finished_build_is_found_and_a_half_built_one_is_not(tmp_path):
    folder = native.build_folder(tmp_path)
    tmp = folder.with_name(f".{folder.name}.tmp-123")         # what a killed build leaves
    (tmp / "bin").mkdir(parents=True)
    (tmp / "bin" / "llama-bench").write_text("")
    assert native.binary(tmp_path) is None
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "llama-bench").write_text("")
    assert native.binary(tmp_path) == folder / "bin" / "llama-bench"
    assert native.skip_reason(tmp_path) is None


def test_the_build_is_keyed_by_this_cpu(monkeypatch):
    """A GGML_NATIVE build runs only on CPUs with the flags it was compiled for: another CPU gets another folder."""
    from edge.analysis.bench import machine
    here = native.machine_key()
    monkeypatch.setattr(machine, "_cpuinfo", lambda: {"model name": "other", "flags": "avx2"})
    assert native.machine_key() != here


def _stand_in(tmp_path: Path, output: str, rc: int = 0) -> tuple[Path, Path]:
    """An executable that records its arguments (a line of JSON per call) and prints `output` (a recorded llama-bench
    run)."""
    args = tmp_path / "argv.json"
    tool = tmp_path / "llama-bench"
    tool.write_text(f"#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]), file=open({str(args)!r}, 'a'))\n"
                    f"sys.stdout.write(open({str(output)!r}).read())\n"
                    f"sys.stderr.write('error: model failed to load\\n')\nsys.exit({rc})\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return tool, args


def test_llama_bench_runs_pp_and_tg_and_is_read_back(tmp_path):
    tool, args = _stand_in(tmp_path, RECORDED)
    gguf = tmp_path / "m.gguf"
    records = native.llama_bench(tool, gguf, 2, prompt=32, gen=8, repeats=2)
    argv = json.loads(args.read_text())
    flags = dict(zip(argv[::2], argv[1::2]))
    assert flags == {"-m": str(gguf), "-t": "2", "-p": "32", "-n": "8", "-r": "2", "-d": "0", "-o": "json"}
    recorded = json.loads(RECORDED.read_text())
    pp, tg = native.test_rate(records, "pp"), native.test_rate(records, "tg")
    assert pp == {"tok_s": round(recorded[0]["avg_ts"], 2), "samples_ts": [round(x, 2) for x in recorded[0]["samples_ts"]],
                  "tokens": 32, "depth": 0}
    assert tg["tok_s"] == round(recorded[1]["avg_ts"], 2) and tg["tokens"] == 8
    info = native.system_info(records)
    assert info["cpu_info"] == recorded[0]["cpu_info"] and info["n_threads"] == 2
    assert info["build"]["llama_cpp_commit"] == native.LLAMA_COMMIT and "-DGGML_NATIVE=ON" in info["build"]["cmake"]


def test_a_failed_llama_bench_is_one_line(tmp_path):
    tool, _ = _stand_in(tmp_path, RECORDED, rc=1)
    with pytest.raises(BitNestError) as e:
        native.llama_bench(tool, tmp_path / "m.gguf", 1, gen=4)
    assert "\n" not in str(e.value) and "model failed to load" in str(e.value) and "m.gguf" in str(e.value)


def test_a_test_llama_bench_did_not_run_is_said():
    with pytest.raises(BitNestError, match="no pp test"):
        native.test_rate([r for r in json.loads(RECORDED.read_text()) if r["n_gen"]], "pp")


def test_passes_only_refuses_the_wheel_peer_in_one_line(capsys):
    from export import commands
    rc = commands.main(["bench", "--shape", "smollm2-360m", "--passes-only", "--peer", "llamacpp"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--peer llamacpp-native" in err[0]


def test_passes_only_times_a_prefill_in_the_runners_process():
    """--prefill N: the synthetic runner's cache holds N + 1 positions and its prefill of N tokens is timed there,
    beside the pass times; no peer ran, so no ratio against one. The draft-head options reach the runner's
    checkpoint (a shortlist head over a draft vocabulary), and the layout's entry says what the draft read."""
    from edge.analysis.bench.passes import bench_passes
    from tests.test_bench import TINY
    draft = {"draft_head": "shortlist", "shortlist_k": 16, "draft_vocab": 8192}
    d = bench_passes(replace(TINY, intermediate_size=448), "tiny", ["online"], 1, 1, 1, "auto", 4, prefill=300,
                     draft=draft)
    lay = d["layouts"]["online"]
    assert {k: lay[k] for k in draft} == draft
    assert lay["prefill"]["tokens"] == 300 and lay["prefill"]["tok_s"] > 0 and len(lay["prefill"]["tok_s_rounds"]) == 1
    assert lay["target_pass_tok_s"] == round(1e3 / lay["ms"]["target"]["1"], 2)
    assert d["read_gbps"] > 0 and len(d["read_gbps_rounds"]) == 1 and lay["target_pass_gbps"] > 0
    assert lay["target_roofline_fraction"] == round(lay["target_pass_gbps"] / d["read_gbps"], 3)
    assert d["llamacpp_native"] is None and "vs_llamacpp_native" not in lay
    assert os.getpid() != lay["pid"]


def test_the_bench_runner_reads_one_llama_bench_process_a_repeat(tmp_path, monkeypatch):
    """bitnest bench's native peer, built from the spec the bench writes as its worker process builds it: each
    repeat is two llama-bench processes at the run's threads, pp at the prompts' median length from an empty cache
    and tg of the new tokens after that many cached positions (as our decode follows its prompt), read back as the
    runner's prefill tok/s and tok/s."""
    import torch

    from edge.analysis.bench.common import native_spec
    from edge.analysis.bench.runners import NativeLlamaRunner, make_runner
    tool, args = _stand_in(tmp_path, RECORDED)
    (native.build_folder(tmp_path) / "bin").mkdir(parents=True)
    tool.rename(native.build_folder(tmp_path) / "bin" / "llama-bench")
    monkeypatch.setenv("BITNEST_CACHE", str(tmp_path))
    threads = torch.get_num_threads()
    try:
        runner = make_runner(native_spec(tmp_path / "m.Q8_0.gguf", [[1] * 30, [1] * 37, [1] * 50], 16, 2))
    finally:
        torch.set_num_threads(threads)                 # make_runner sets the run's count, as a worker process does
    got = runner.run()
    calls = [json.loads(line) for line in args.read_text().splitlines()]
    flags = [dict(zip(argv[::2], argv[1::2])) for argv in calls]
    assert [(f["-p"], f["-n"], f["-d"], f["-t"], f["-r"]) for f in flags] == [("37", "0", "0", "2", "1"),
                                                                              ("0", "16", "37", "2", "1")]
    recorded = json.loads(RECORDED.read_text())
    assert got["tok_s"] == round(recorded[1]["avg_ts"], 2) and got["prefill_tok_s"] == round(recorded[0]["avg_ts"], 2)
    assert got["tg_depth"] == 37
    assert runner.info == {"kind": "llamacpp_native", "threads": 2, "gguf": "m.Q8_0.gguf", "native": True}
    with pytest.raises(RuntimeError, match="ensure_built"):
        NativeLlamaRunner("m.gguf", 2, 37, 16, str(tmp_path / "empty"))
