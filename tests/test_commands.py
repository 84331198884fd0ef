"""Every `bitnest` command (export.commands, the table scripts/*.py wrap) run once through the command table on a
small real export, with its defaults except fewer prompts and tokens where the defaults would take minutes; policy
lists stay the commands' own defaults (the J/token command's default list once held the gates, which need
calibrated thresholds, and failed on every fresh export). `compile-kernels` runs in tests/test_compile_kernels.py."""

import json
import shutil

import pytest

from edge.decode.registry import POLICIES
from edge.model.checkpoint import load_checkpoint
from export import commands
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def small(small_llama_checkpoint, tmp_path_factory):
    """A private copy of the small Llama export (calibrate writes its thresholds beside it)."""
    ck = tmp_path_factory.mktemp("cmd") / "small"
    shutil.copytree(small_llama_checkpoint, ck)
    return ck


def bitnest(capsys, *argv) -> dict:
    """Run `bitnest ARGV` in this process; its last stdout line as JSON (the --json contract)."""
    rc = commands.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_every_command_is_in_this_file():
    text = (ROOT / "tests" / "test_commands.py").read_text()
    untested = [n for n in commands.COMMANDS if n != "compile-kernels" and f'"{n}"' not in text]
    assert untested == []


def test_chat(small, capsys):
    out = bitnest(capsys, "chat", "--checkpoint", small, "--prompt", "Say hi.", "--max-new-tokens", 8, "--json")
    assert len(out["tokens"]) >= 1 and out["stats"]["policy"] == "auto" and out["stats"]["gamma_histogram"]


def test_export_with_its_default_method_and_rotation(small_llama_folder, tmp_path, capsys):
    out = bitnest(capsys, "export", "--model", small_llama_folder, "--out", tmp_path / "ck", "--calib-samples", 4,
                  "--calib-seq-len", 64, "--json")
    assert out["method"] == "bitnest" and (tmp_path / "ck" / "manifest.json").is_file()
    # a model from its own files records the shortlist draft head (edge.model.draft_head.DRAFT_HEAD_SOURCE_DEFAULT)
    assert out["draft_head"] == "shortlist" and load_checkpoint(tmp_path / "ck").draft_head == "shortlist"


def test_evaluate(small, capsys):
    out = bitnest(capsys, "evaluate", "--checkpoint", small, "--tokens", 256, "--window", 128, "--json")
    assert set(out["ppl"]) == {"reference", "draft", "target"}
    assert set(out["ppl"]["draft"]) == {"sharegpt", "shakespeare", "code"}


def test_draft_layers(small, capsys):
    """The small Llama's two layers: the full draft, each layer skipped alone, and a curve of one point."""
    out = bitnest(capsys, "draft-layers", "--checkpoint", small, "--tokens", 64, "--most", 1, "--backend", "cpu",
                  "--json")
    assert [p["skipped"] for p in out["single"]] == [[0], [1]] and len(out["curve"]) == 1
    assert out["full"]["skipped"] == [] and out["full"]["draft_bytes_share"] == 1.0
    assert all(p["draft_bytes"] < out["full"]["draft_bytes"] and 0 <= p["agreement"] <= 1 for p in out["single"])
    assert out["costs"]["backend"] == "cpu" and out["positions"] == 64


def test_bench_beside_llamacpp(rtn_checkpoint, capsys):
    """The target, speculation and `auto` (the default's headline; `adaptive` and `draft` run through the same runner
    with another policy name) and llama.cpp (the bench extra's xllamacpp, its ggml features recorded, on the GGUF the
    checkpoint was exported from, the default model's shipped Q4_1, and a Q8_0 made from it, and, asked for, llama.cpp's
    own speculation: Q8_0 verifying, Q4_1 drafting, never in the headline), each runner in a fresh process of its own
    at the step's thread count, with the read probe past the last-level cache and the pass times of the target's
    process."""
    import os

    from edge.model.checkpoint import load_checkpoint
    policies = ["target", "speculative"] + ["auto"] * ("auto" in POLICIES)
    out = bitnest(capsys, "bench", "--checkpoint", rtn_checkpoint, "--prompts", 1, "--max-new-tokens", 4, "--repeats", 1,
                  "--pass-repeats", 1, "--peer", "llamacpp", "--peer", "llamacpp-speculative",
                  *[x for p in policies for x in ("--policy", p)], "--json")
    assert list(out["runs"]) == policies + ["llamacpp_q4_1", "llamacpp_q8_0", "llamacpp_speculative"]
    assert out["identical_to_target"] == {p: 1 for p in policies if p != "target"}   # the speed of lossless output
    lead = out["headline"]
    assert lead["policy"] == ("auto" if "auto" in POLICIES else "target")
    assert set(lead["vs"]) == {"llamacpp_q8", "llamacpp_q4_1"}       # the strawman speculation is never a headline
    assert all(out["runs"][r]["system_info"]["wheel"].startswith("xllamacpp ") and out["runs"][r]["system_info"]["features"]
               for r in ("llamacpp_q4_1", "llamacpp_q8_0"))         # what the wheel was built for, on record
    assert all(r["tok_s"] > 0 for r in out["runs"].values()) and out["threads"] >= 1 and out["read_gbps"] > 0
    # both sides count the decode steps' tokens: llama.cpp's predicted_n also counts the prompt pass's token
    assert out["runs"]["llamacpp_q8_0"]["tokens"] == out["runs"]["target"]["tokens"] == 3, out["runs"]
    assert {"speculative_vs_target", "target_vs_llamacpp_q8", "target_vs_llamacpp_q4_1",
            "verification_pass_vs_target_pass", "draft_pass_vs_target_pass"} <= set(out["ratios"])
    assert ("auto_vs_target" in out["ratios"]) == ("auto" in POLICIES)
    assert out["isolation"] == "process per runner" and out["isa"] and out["machine"]["threads"] == out["threads"]
    assert out["draft_head"] == load_checkpoint(rtn_checkpoint).draft_head          # what the runs' draft read of the head
    pids = [r["pid"] for r in out["runs"].values()] + [out["probe"]["pid"]]
    assert len(set(pids)) == len(pids) and os.getpid() not in pids
    assert out["probe"]["bytes"] >= 4 * out["machine"]["llc"]["bytes"] > 0
    assert out["pass_times"]["pid"] == out["runs"]["target"]["pid"]
    ms = out["pass_times"]["ms"]
    assert set(ms) == {"draft", "target"} and all(set(v) == {str(w) for w in range(1, 9)} for v in ms.values())
    assert all(v > 0 for view in ms.values() for v in view.values())
    assert [len(r) for r in out["runs"]["speculative"]["rounds"]] and out["runs"]["speculative"]["acceptance"] is not None


def test_lossless(small, capsys):
    out = bitnest(capsys, "lossless", "--checkpoint", small, "--prompts", 2, "--max-new-tokens", 8, "--json")
    assert out["lossless"] and out["identical"] == 2


def test_max_context(small, capsys):
    out = bitnest(capsys, "max-context", "--device", "orin-nx-8gb", "--model", small, "--json")
    assert out["configs"]["bitnest"]["max_context"] > 0


def test_joules_with_its_default_policy_list(small, capsys):
    """The issue's command on a fresh export (no thresholds): the default list is speculative, target, draft."""
    out = bitnest(capsys, "joules", "--checkpoint", small, "--meter", "none", "--prompts", 1, "--max-new-tokens", 6,
                  "--idle-seconds", 0.1, "--json")
    assert list(out["policies"]) == ["speculative", "target", "draft"]
    assert all(p["joules_per_token"] is None and p["tokens"] > 0 for p in out["policies"].values())


def test_selfcheck_with_its_default_paths(small, capsys):
    out = bitnest(capsys, "selfcheck", "--checkpoint", small, "--tokens", 2, "--json")
    by = {p["path"]: p for p in out["paths"]}
    assert out["passed"] and by["torch"]["status"] == "passed" and all(p["status"] != "failed" for p in out["paths"])


def test_calibrate_replay_and_compare(small, capsys):
    cal = bitnest(capsys, "calibrate", "--checkpoint", small, "--prompts", 2, "--max-new-tokens", 12, "--json")
    assert cal["steps"] >= 10
    rep = bitnest(capsys, "replay", "--checkpoint", small, "--prompts", 2, "--max-new-tokens", 12, "--resamples", 50,
                  "--json")
    assert rep["prompts"] == 2
    cmp = bitnest(capsys, "compare", "--checkpoint", small, "--prompts", 2, "--max-new-tokens", 6, "--match-tokens", 4,
                  "--phase-prompts", 1, "--phase-tokens", 12, "--resamples", 50, "--json")
    assert set(cmp["policies"]) <= set(POLICIES) | {"gate-random", "gate-random@repair"} and "target" in cmp["policies"] and "phase" in cmp


def test_quality_table_writes_only_where_told(small_llama_folder, tmp_path, capsys):
    """Results elsewhere than the repository's own leave the docs alone (their tables render the repo's JSON)."""
    docs = {p: p.read_bytes() for p in (ROOT / "docs").glob("*.md")}
    out = bitnest(capsys, "quality-table", "--model", small_llama_folder, "--work", tmp_path / "work", "--tokens", 256,
                  "--only", "rtn", "top4of8", "--results", tmp_path / "q.json", "--json")
    assert out["configs"] == ["rtn", "top4of8"] and out["tables_written"] == []
    saved = json.loads((tmp_path / "q.json").read_text())
    assert list(saved) == ["_reference", "rtn", "top4of8"] and saved["rtn"]["rotation"] == "none"
    assert {p: p.read_bytes() for p in (ROOT / "docs").glob("*.md")} == docs


def test_export_memory_at_the_default_models_shapes(tmp_path, capsys):
    """Two streamed exports (1 and 2 blocks of synthetic weights at SmolLM2-135M's shapes), each in its own process:
    their measured and planned peaks, seconds per block, and the whole model's plan."""
    out = bitnest(capsys, "export-memory", "--shape", "smollm2-135m", "--layers", 1, 2, "--calib-samples", 2,
                  "--calib-seq-len", 32, "--out", tmp_path / "m.json", "--json")
    assert out == json.loads((tmp_path / "m.json").read_text()) and out["shape"]["layers"] == 30
    runs = out["runs"]
    assert [len(runs[n]["seconds_per_layer"]) for n in ("1", "2")] == [1, 2]
    assert all(0 < r["measured_peak"] and r["planned_peak"] == r["plan"]["peak"] for r in runs.values())
    assert runs["2"]["checkpoint_bytes"] > runs["1"]["checkpoint_bytes"]
    whole = out["plan_whole_model"]["default_settings"]
    assert whole["streams"] == 64 * 512 * 576 * 4 and whole["peak"] > whole["streams"]   # samples x tokens x hidden


def test_verify_onnx_after_export_existing_onnx(small, tmp_path, capsys):
    ck = tmp_path / "onnx-ck"
    shutil.copytree(small, ck)
    exp = bitnest(capsys, "export", "--out", ck, "--existing", "--onnx", "--json")
    out = bitnest(capsys, "verify-onnx", "--checkpoint", ck, "--onnx", exp["onnx"]["onnx"], "--json")
    assert out["max_rel_err"] < 1e-3 and out["argmax_agreement"] == 1.0


def test_bench_kernels_without_a_gpu_is_one_line(capsys):
    rc = commands.main(["bench-kernels"])
    err = capsys.readouterr().err.strip().splitlines()
    if rc == 0:
        pytest.skip("a CUDA GPU is here")
    assert rc == 2 and len(err) == 1 and "GPU" in err[0]


def test_gemv_sweep_refuses_bad_shapes_and_a_missing_gpu_in_one_line(capsys):
    for argv, words in ((["gemv-sweep", "--shapes", "1000x64"], "multiple of 32 and K of 1024"),
                        (["gemv-sweep", "--shapes", "8192by64"], "K x N pairs")):
        assert commands.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    rc = commands.main(["gemv-sweep"])
    err = capsys.readouterr().err.strip().splitlines()
    if rc == 0:
        pytest.skip("a CUDA GPU is here")
    assert rc == 2 and len(err) == 1 and "CUDA GPU" in err[0]


def test_tables_check_finds_the_docs_current(capsys):
    assert commands.main(["tables", "--check"]) == 0, capsys.readouterr().err


def test_device_check_table_of_a_missing_file_is_one_line(tmp_path, capsys):
    """(The checks themselves run in tests/test_device_check.py, --dry in the Triton interpreter.)"""
    rc = commands.main(["device-check", "--table", str(tmp_path / "none.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "none.json does not exist" in err[0]


def test_replay_tegrastats(capsys):
    rc = commands.main(["replay-tegrastats", str(ROOT / "tests" / "data" / "tegrastats_orin_8gb.log"), "--lines", "2",
                        "--interval-ms", "1"])
    assert rc == 0 and capsys.readouterr().out.count("VDD_IN") == 2


def test_the_fuzzer_mutates_a_sealed_copy(small, tmp_path):
    """A checkpoint exported before manifests carried a seal loads unsealed; the fuzzer seals its private copy, so
    a mutated manifest that keeps the exported seal must be refused (run on an unsealed subject, it counted a
    dropped `offset` field as a wrong load), and it leaves the subject's ONNX graph out of the copy."""
    from edge.analysis.fuzz.readers import fuzz_copy
    from edge.model.manifest import SEAL, manifest_seal
    old = tmp_path / "old"
    shutil.copytree(small, old)
    m = json.loads((old / "manifest.json").read_text())
    del m[SEAL]
    (old / "manifest.json").write_text(json.dumps(m))
    (old / "decoder_step.onnx").write_bytes(b"graph")
    copy = fuzz_copy(old, tmp_path / "work")
    sealed = json.loads((copy / "manifest.json").read_text())
    assert sealed[SEAL] == manifest_seal(sealed) and not (copy / "decoder_step.onnx").exists()


def test_fuzz_inputs_finds_no_crash_hang_wrong_load_or_refused_valid_input(small, capsys):
    """A short run of the fuzzer over the readers that take seconds (its full run, 500 cases a reader with the ONNX
    graph, command-line values and killed and disk-full exports, is in README), counted per reader: no crash, hang,
    wrong load (a load other than the oracle's expectation: edge.analysis.fuzz.oracle parses the weights itself),
    or refusal of an input the oracle calls valid; every reader saw valid inputs, loaded them and refused others.
    A prompts reader that coerces {"prompt": 0.5} or {"chat": "false"} fails it (wrong loads), as does a checkpoint
    reader that returns stale tensors after a re-sealed change or refuses a re-formatted manifest."""
    cases = 40
    out = bitnest(capsys, "fuzz-inputs", "--checkpoint", small, "--cases", cases, "--kills", 0, "--readers",
                  "manifest,weights,prompts,thresholds,tegrastats", "--json")
    assert set(out["readers"]) == {"manifest", "weights", "prompts", "thresholds", "tegrastats"}
    for name, r in out["readers"].items():
        bad = {k: r[k] for k in ("crash", "hang", "wrong", "refused_valid") if r[k]}
        assert bad == {}, (name, bad, r["examples"])
        assert sum(r[k] for k in ("error", "accepted", "crash", "hang", "wrong", "refused_valid")) == cases, name
        assert r["valid"] > 0 and r["accepted"] >= r["valid"], (name, r)
        assert r["error"] > 0 or name == "tegrastats", (name, r)    # a line without readings is None, not an error


def test_serve_on_a_taken_port_is_one_line_before_the_model_loads(small, capsys):
    """`serve` listens before it loads the model, so a taken port fails at once (tests/test_serve.py drives a running
    server with the openai client)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        rc = commands.main(["serve", "--checkpoint", str(small), "--port", str(port)])
    out, err = capsys.readouterr()
    assert rc == 2 and err.strip().splitlines() == [f"serve.py: error: cannot listen on 127.0.0.1:{port}: Address "
                                                    "already in use"], err


def test_weights_memory(small, capsys):
    """`--weights base` against the full load in two fresh processes: the small export's head is float16, so every
    refinement plane is left unread; the draft policy's answers are the same tokens."""
    out = bitnest(capsys, "weights-memory", "--checkpoint", small, "--backend", "cpu", "--prompts", 1,
                  "--max-new-tokens", 3)
    assert out["same_tokens"] and out["unread_by_base_bytes"] == out["refinement_bytes"] > 0
    assert out["runs"]["nested"]["read_while_loading_bytes"] - out["runs"]["base"]["read_while_loading_bytes"] == \
        out["unread_by_base_bytes"]
