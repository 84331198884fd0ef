"""`bitnest bench` is fair and its memory-bound path runs: runners in processes of their own
(edge.analysis.bench.process), a read probe past the last-level cache (edge.analysis.bench.machine), speculation replayed
from recorded rounds with real passes (edge.analysis.bench.replay), a GGUF of a model's shapes that llama.cpp loads
(edge.analysis.bench.synthetic_gguf), `--shape` at a tiny made-up shape through every runner, and bad input as one line.
No timing is asserted: speed is the benchmark's to report (scripts/bench.py), never a test's."""

import argparse
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from edge.analysis.bench import shape as shape_mod
from edge.analysis.bench.run import DEFAULT_POLICIES
from edge.analysis.bench.common import paired_ratios, ratios
from edge.analysis.bench.replay import (alpha_from_tokens_per_round, expected_tokens, judged_acceptance, projected,
                                        replay_generation)
from edge.analysis.bench.machine import PROBE_LLC_MULTIPLE, llc_bytes, machine, probe_bytes
from edge.analysis.bench.peers import shipped_gguf
from edge.analysis.bench.synthetic_gguf import (BYTES, FILLER, SCALE, SPECIAL, donor_tokenizer, q8_0_bytes_per_token,
                                          synthetic_gguf, synthetic_gguf_problem, tensor_shapes)
from edge.memory.model_shapes import BENCH_SHAPES, MODEL_PRESETS
from edge.model.arch import ModelConfig
from edge.model.gguf_file import GGUFReader  # gguf-py's reader, parsed faster (tests/test_gguf_file.py)
from export import commands

TINY = ModelConfig(architecture="LlamaForCausalLM", family="llama", hidden_size=128, intermediate_size=256,
                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=64, vocab_size=49152, rms_norm_eps=1e-5,
                   rope_theta=1e5, tie_word_embeddings=True, attention_bias=False, max_position_embeddings=2048)
# Qwen2.5's vocabulary, biases and untied head at a tiny width (llama.cpp's qwen2 needs heads x head_dim = hidden)
TINY_QWEN2 = ModelConfig(architecture="Qwen2ForCausalLM", family="qwen2", hidden_size=64, intermediate_size=128,
                         num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, vocab_size=151936, rms_norm_eps=1e-6,
                         rope_theta=1e6, tie_word_embeddings=False, attention_bias=True, max_position_embeddings=2048)


@pytest.fixture(scope="module")
def small(small_llama_checkpoint, tmp_path_factory):
    ck = tmp_path_factory.mktemp("bench") / "small"
    shutil.copytree(small_llama_checkpoint, ck)
    return ck


def _cli(capsys, *argv) -> tuple[int, str, str]:
    rc = commands.main(["bench", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def _my_children() -> list[int]:
    """Live processes whose parent is this one (a worker left behind would be one)."""
    me, found = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


# -- the machine and the probe ------------------------------------------------------------------------------------
def test_the_probe_is_sized_past_the_last_level_cache():
    m = machine(2)
    cpu = next(line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.startswith(("flags", "Features")))                   # what the kernel says this CPU has
    assert m["threads"] == 2
    assert {f: m["isa_flags"][f] for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")} == \
        {f: f in cpu for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")}
    assert m["llc"]["bytes"] >= max([c["bytes"] for c in m["caches"]] + [m["llc"]["getconf_bytes"]])
    assert m["probe_bytes"] >= PROBE_LLC_MULTIPLE * m["llc"]["bytes"]
    for llc in (0, 1 << 20, 300 << 20, (300 << 20) + 1):
        assert probe_bytes(llc) >= PROBE_LLC_MULTIPLE * llc and probe_bytes(llc) % (64 << 20) == 0


def test_the_llc_is_the_deepest_data_cache():
    found = [{"level": 1, "type": "Data", "bytes": 48 << 10}, {"level": 1, "type": "Instruction", "bytes": 1 << 30},
             {"level": 2, "type": "Unified", "bytes": 1 << 20}, {"level": 3, "type": "Unified", "bytes": 32 << 20}]
    llc = llc_bytes(found)
    assert llc["sysfs_bytes"] == 32 << 20 and llc["sysfs_level"] == 3      # not the (larger) instruction cache
    assert llc["bytes"] == max(32 << 20, llc["getconf_bytes"])


# -- speculation at a shape without meaningful acceptance -----------------------------------------------------------
def test_expected_tokens_and_the_projection():
    assert expected_tokens(0.0, 4) == 1.0 and expected_tokens(1.0, 4) == 5.0
    assert abs(expected_tokens(0.5, 4) - 1.9375) < 1e-12
    compute_bound = {"draft": {"1": 5.0}, "target": {str(w): 10.0 + (w - 1) for w in range(1, 9)}}
    p = projected(compute_bound, 0.5)
    assert p["tok_s_by_gamma"]["0"] == 100.0                                 # a target step: 1 token in 10 ms
    assert p["tok_s_by_gamma"]["4"] == round(1.9375 / ((4 * 5 + 14) / 1e3), 2)
    assert p["best_gamma"] == 0 and p["vs_target_by_gamma"]["0"] == 1.0
    memory_bound = {"draft": {"1": 2.0}, "target": {str(w): 10.0 for w in range(1, 9)}}   # width costs nothing
    p = projected(memory_bound, 0.8)
    assert p["best_gamma"] == 4 and p["vs_target_by_gamma"]["4"] == round(expected_tokens(0.8, 4) * 10 / 18, 3)


def test_the_projection_takes_the_judged_acceptance():
    """E = (1 - α^(γ+1)) / (1 - α) means α = accepted ÷ judged: a round judges its accepted proposals and the first
    rejected one, never those after it. Rounds of γ = 4 accepting 1, 4 and 0: 5 accepted of 7 judged (of 12
    drafted); a file that kept only its tokens per round gives the same α back."""
    rounds = [[[4, 1], [4, 4]], [[4, 0]]]
    assert judged_acceptance(rounds) == round(5 / 7, 4) and judged_acceptance([]) is None
    assert alpha_from_tokens_per_round(expected_tokens(0.7, 4), 4) == 0.7
    assert alpha_from_tokens_per_round(1.0, 4) == 0.0 and alpha_from_tokens_per_round(5.0, 4) == 1.0


def test_paired_ratios_set_each_repeat_against_its_own():
    """tok/s a bench recorded on the Qwen export while the host's bandwidth moved between repeats (probe 43-75 GB/s):
    the ratio of the medians (1.119) sets the speculative runner's fourth repeat against the target's fastest but one,
    and the median of the repeat-by-repeat ratios (1.24) does not."""
    samples = {"target": [{"tok_s": x} for x in (77.72, 106.75, 79.84, 102.05, 110.89)],
               "speculative": [{"tok_s": x} for x in (92.09, 132.34, 99.12, 114.2, 142.53)]}
    assert ratios({"target": 102.05, "speculative": 114.2})["speculative_vs_target"] == 1.119
    got = paired_ratios(samples)
    assert set(got) == {"speculative_vs_target"}
    assert got["speculative_vs_target"] == {"median": 1.24, "samples": [1.185, 1.24, 1.241, 1.119, 1.285]}


def test_the_shape_table_sets_each_round_against_llamacpps_same_round():
    """Round 1 (a slow host): 50 ms a pass (20 tok/s) beside llama.cpp's 10 tok/s; round 2 (a fast one): 25 ms (40
    tok/s) beside 40. Round by round 2.00× and 1.00×; any other pairing (round 1 against round 2's peer) gives 0.50×
    or 4.00×, and a file without rounds says so rather than inventing them."""
    from edge.analysis.report.shapes import paired_q8_ratios
    d = {"layouts": {"online": {"ms_rounds": [{"target": {"1": 50.0}}, {"target": {"1": 25.0}}]}},
         "llamacpp_native": {"q8_0": {"tg_tok_s_rounds": [10.0, 40.0]}}}
    assert paired_q8_ratios(d) == [2.0, 1.0]
    assert paired_q8_ratios({"layouts": {"online": {}}, "llamacpp_native": {"q8_0": {}}}) == []


def test_stop_at_eos_ends_a_policys_generations_at_the_runtimes_end_of_text(rtn_checkpoint):
    """By default a policy runner writes exactly max_new_tokens (EOS ignored, as the peers); with --stop-at-eos a
    generation ends at the first token of the runtime's EOS set, that token included. The EOS set here is a token
    of the runner's own output (nothing assumed about what the model writes)."""
    from edge.analysis.bench.runners import PolicyRunner
    from edge.decode.generate import generate
    from edge.llm import Runtime
    prompt = Runtime(rtn_checkpoint, backend="cpu", max_context=64).encode("List three uses of a paperclip.")
    r = PolicyRunner(str(rtn_checkpoint), "auto", "speculative", 4, 12, [prompt], 128, 16, {}, {})
    assert r.run()["tokens"] == 11                       # decode-phase tokens: the prefill wrote the first
    tokens = generate(r.rt.engine, prompt, r.cfg, eos=set())[0]
    k = next((i for i in range(1, 11) if tokens[i] not in tokens[:i]), None)
    assert k is not None, f"the model wrote one token over and over: {tokens}"
    r.rt.eos.clear()
    r.rt.eos.add(tokens[k])                              # the LLM's own set, in place
    assert r.run()["tokens"] == 11                       # not asked: still ignored
    r.stop_at_eos = True
    assert r.run()["tokens"] == k


def test_a_replay_follows_the_recorded_rounds_with_real_passes(small):
    """Every round runs γ draft passes and one verification, keeps exactly the recorded count and rolls the rest
    back: the committed length ends past the prompt and every emitted token but the pending one."""
    from edge.backends import make_engine
    from edge.model.checkpoint import load_checkpoint
    ckpt = load_checkpoint(small)
    eng = make_engine("auto", ckpt, 256, scratch=5)
    prompt = list(range(100, 120))
    rounds = [[4, 0], [4, 4], [4, 2]]                      # 1 + 5 + 3 tokens after the prefill's
    stats = replay_generation(eng, prompt, rounds, 10)
    assert (stats.rounds, stats.drafted, stats.accepted) == (3, 12, 6)
    assert (stats.draft_passes, stats.target_passes, stats.tokens) == (12, 3, 9)
    assert eng.length == len(prompt) + 9
    stats = replay_generation(eng, prompt, [[3, 3]], 9)    # cycled: two rounds of 4 tokens
    assert (stats.rounds, stats.accepted, eng.length) == (2, 6, len(prompt) + 8)


# -- the synthetic GGUF -------------------------------------------------------------------------------------------
def test_the_synthetic_gguf_has_the_shapes_and_the_tokenizer(tmp_path):
    import gguf
    path = synthetic_gguf(TINY, "tiny", shipped_gguf(), tmp_path)
    assert synthetic_gguf(TINY, "tiny", shipped_gguf(), tmp_path) == path           # written once
    assert [p.name for p in tmp_path.iterdir()] == [path.name]                      # no temporary left
    r = GGUFReader(str(path))
    value = lambda k: r.fields[k].contents()
    assert (value("llama.embedding_length"), value("llama.block_count"), value("llama.feed_forward_length"),
            value("llama.attention.head_count"), value("llama.attention.head_count_kv")) == (128, 2, 256, 2, 1)
    assert value("tokenizer.chat_template") == donor_tokenizer(shipped_gguf())["tokenizer.chat_template"][1]
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 49152
    want = tensor_shapes(TINY)
    assert {t.name: tuple(int(x) for x in reversed(t.shape)) for t in r.tensors} == want
    q80 = gguf.GGMLQuantizationType.Q8_0
    for t in r.tensors:
        assert (t.tensor_type == q80) == (len(want[t.name]) == 2), t.name
    w = next(t for t in r.tensors if t.name == "blk.1.ffn_down.weight")
    x = gguf.quants.dequantize(w.data, q80)                                         # [128, 256]
    assert x.shape == (128, 256) and 0 < abs(x).max() <= 127 * SCALE + 1e-9 and abs(x).std() > 10 * SCALE


def test_a_gguf_shape_llamacpp_cannot_take_is_one_line(tmp_path):
    from edge.errors import BitNestError
    with pytest.raises(BitNestError, match="at least 259 tokens, not 100"):
        synthetic_gguf(replace(TINY, vocab_size=100), "x", shipped_gguf(), tmp_path)
    with pytest.raises(BitNestError, match="multiple of 32"):
        synthetic_gguf(replace(TINY, intermediate_size=200), "x", shipped_gguf(), tmp_path)
    with pytest.raises(BitNestError, match="heads x head_dim = hidden"):
        synthetic_gguf(replace(TINY_QWEN2, head_dim=64), "x", shipped_gguf(), tmp_path)
    with pytest.raises(BitNestError, match="not gemma"):
        synthetic_gguf(replace(TINY, family="gemma"), "x", shipped_gguf(), tmp_path)
    assert not list(tmp_path.iterdir())


def test_every_bench_shape_has_a_synthetic_gguf():
    assert {n: synthetic_gguf_problem(MODEL_PRESETS[n], shipped_gguf()) for n in BENCH_SHAPES} == \
        dict.fromkeys(BENCH_SHAPES)


def _tensors(reader) -> dict[str, tuple]:
    """GGUF tensor name -> (numpy-order shape, type) as `reader` holds them."""
    return {t.name: (tuple(int(x) for x in reversed(t.shape)), t.tensor_type) for t in reader.tensors}


def _assert_tensors(reader, cfg: ModelConfig) -> None:
    """`cfg`'s tensors: weights Q8_0, norms and biases F32."""
    import gguf
    q80, f32 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
    want = {t: (shape, q80 if len(shape) == 2 else f32) for t, shape in tensor_shapes(cfg).items()}
    assert _tensors(reader) == want


@pytest.fixture(scope="module")
def gguf_cache(tmp_path_factory):
    """One folder for the module: a file written by one test is reused (not rewritten) by the next."""
    return tmp_path_factory.mktemp("gguf")


def test_q8_0_bytes_per_token_are_what_the_files_tensors_hold_past_the_embedding(gguf_cache):
    """The bytes the shapes table prices llama.cpp's decode step at: every tensor as the written file holds it, the
    token embedding left out (one row a token) unless the head is tied to it (then it is the head, read whole)."""
    for cfg, name in ((TINY_QWEN2, "tiny-qwen2"), (TINY, "tiny")):
        r = GGUFReader(str(synthetic_gguf(cfg, name, shipped_gguf(), gguf_cache)))
        read = sum(int(t.n_bytes) for t in r.tensors if t.name != "token_embd.weight" or cfg.tie_word_embeddings)
        assert q8_0_bytes_per_token(cfg) == read, name


def test_a_qwen2_shape_is_a_qwen2_gguf_with_biases_and_its_own_head(gguf_cache):
    import gguf
    r = GGUFReader(str(synthetic_gguf(TINY_QWEN2, "tiny-qwen2", shipped_gguf(), gguf_cache)))
    value = lambda k: r.fields[k].contents()
    assert value("general.architecture") == "qwen2"
    assert (value("qwen2.embedding_length"), value("qwen2.block_count"), value("qwen2.feed_forward_length"),
            value("qwen2.attention.head_count"), value("qwen2.attention.head_count_kv"),
            value("qwen2.rope.dimension_count"), value("qwen2.vocab_size")) == (64, 2, 128, 2, 1, 32, 151936)
    assert value("qwen2.rope.freq_base") == 1e6 and not any(k.startswith("llama.") for k in r.fields)
    _assert_tensors(r, TINY_QWEN2)
    names = {t.name for t in r.tensors}
    assert {f"blk.1.attn_{p}.bias" for p in "qkv"} <= names and "output.weight" in names
    assert "output.weight" not in tensor_shapes(replace(TINY_QWEN2, tie_word_embeddings=True))
    # the donor's 49,152 tokens, then unused fillers to Qwen2.5's 151,936: prompts tokenize as the default model's
    tokens, donor = value("tokenizer.ggml.tokens"), donor_tokenizer(shipped_gguf())
    n = len(donor["tokenizer.ggml.tokens"][1])
    assert len(tokens) == 151936 and tokens[:n] == donor["tokenizer.ggml.tokens"][1]
    assert tokens[n] == FILLER.format(n) and tokens[-1] == FILLER.format(151935)
    types = value("tokenizer.ggml.token_type")
    assert len(types) == 151936 and set(types[n:]) == {gguf.TokenType.UNUSED}
    assert value("tokenizer.chat_template") == donor["tokenizer.chat_template"][1]
    assert "padded with unused tokens" in value("general.name")


def test_a_llama3_shape_has_its_vocabulary_of_128256(gguf_cache):
    cfg = replace(TINY, hidden_size=64, num_heads=1, vocab_size=128256)
    r = GGUFReader(str(synthetic_gguf(cfg, "tiny-llama3", shipped_gguf(), gguf_cache)))
    value = lambda k: r.fields[k].contents()
    assert value("general.architecture") == "llama" and value("llama.vocab_size") == 128256
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 128256
    _assert_tensors(r, cfg)                                     # tied, no bias: no output.weight, no .bias
    assert not any(t.name == "output.weight" or t.name.endswith(".bias") for t in r.tensors)


def test_a_vocabulary_smaller_than_the_donors_is_synthetic(gguf_cache):
    import gguf
    cfg = replace(TINY, vocab_size=32000, tie_word_embeddings=False)
    r = GGUFReader(str(synthetic_gguf(cfg, "tiny-llama2", shipped_gguf(), gguf_cache)))
    value = lambda k: r.fields[k].contents()
    tokens, types = value("tokenizer.ggml.tokens"), value("tokenizer.ggml.token_type")
    assert value("tokenizer.ggml.model") == "llama" and len(tokens) == len(types) == 32000
    assert tokens[:len(SPECIAL) + len(BYTES)] == [*SPECIAL, *BYTES] and tokens[-1] == "tok31999"
    assert tokens[len(SPECIAL) + 0x41] == "<0x41>" and types[len(SPECIAL) + 0x41] == gguf.TokenType.BYTE
    assert (value("tokenizer.ggml.unknown_token_id"), value("tokenizer.ggml.bos_token_id"),
            value("tokenizer.ggml.eos_token_id")) == (0, 1, 2)
    assert set(types[len(SPECIAL) + len(BYTES):]) == {gguf.TokenType.NORMAL}
    assert "synthetic vocabulary" in value("general.name")
    _assert_tensors(r, cfg)


@pytest.mark.parametrize("cfg, name", [(TINY_QWEN2, "tiny-qwen2"), (replace(TINY, vocab_size=32000), "tiny-llama2")],
                         ids=["qwen2-padded-vocabulary", "llama-synthetic-vocabulary"])
def test_llamacpp_loads_and_decodes_the_synthetic_gguf(gguf_cache, cfg, name):
    pytest.importorskip("xllamacpp", reason="llama.cpp's wheel (the bench extra) is not installed")
    from edge.analysis.bench.peers import LlamaCpp
    llm = LlamaCpp(synthetic_gguf(cfg, name, shipped_gguf(), gguf_cache), threads=1, n_ctx=256)
    tokens, seconds = llm.decode([{"role": "user", "content": "Name three rivers."}], 8)
    assert tokens == 7 and seconds > 0            # 8 generated, the prompt pass's first not a decode step
    assert llm.timings["prompt_n"] > 0


# -- --shape through every runner ---------------------------------------------------------------------------------
def _shape_args(**kw) -> argparse.Namespace:
    base = dict(backend="auto", prompts=1, max_new_tokens=4, repeats=1, gamma=4, gamma_max=8, threads=None,
                pass_repeats=1, policy=None, peer=None, acceptance_from=None, gate_threshold=None, gate_rate=0.15,
                gate_signal="entropy", gate_seed=0, phase_tag="</think>", phase_order="low-high",
                adaptive_signal="margin", adaptive_stop=1.0, adaptive_extend=6.0, draft_head=None, shortlist_k=None,
                draft_vocab=None)
    return argparse.Namespace(**(base | kw))


def test_a_shape_bench_measures_replays_and_projects_in_separate_processes(small, tmp_path, monkeypatch):
    """A tiny made-up shape through the --shape path: the real model's rounds recorded in their own process, the
    synthetic target, draft and replayed runners, llama.cpp on a GGUF of the same shapes and the probe, each in a
    process of its own; the JSON says which speculation figure is replayed and which projected."""
    monkeypatch.setattr(shape_mod, "cache_folder", lambda: tmp_path)
    d = shape_mod.bench_shape(_shape_args(), TINY, "tiny", str(small), "test")
    assert d["shape"] == "tiny" and d["speculative_method"] == "replayed" and d["isolation"] == "process per runner"
    assert d["draft_head"] == "shortlist"                  # the head an export from a model's own files records
    assert d["r4_factors"] == [256]                        # and its online R4 (and R1)
    assert set(d["runs"]) == {"target", "draft", "speculative_replayed", "llamacpp_q8_0"}
    assert all(r["tok_s"] > 0 for r in d["runs"].values())
    pids = [r["pid"] for r in d["runs"].values()] + [d["probe"]["pid"], d["acceptance_source"]["pid"]]
    assert len(set(pids)) == len(pids) and os.getpid() not in pids
    assert d["pass_times"]["pid"] == d["runs"]["target"]["pid"]
    assert set(d["pass_times"]["ms"]["target"]) == {str(w) for w in range(1, 9)}
    acc = d["acceptance_source"]
    assert acc["source"] == "this run" and acc["rounds"] >= 1
    rep = d["runs"]["speculative_replayed"]
    assert rep["acceptance"] == acc["acceptance"] and rep["draft_passes"] == 4 * rep["target_passes"]
    assert {"target_vs_llamacpp_q8", "projected_speculative_vs_target", "replayed_speculative_vs_target"} <= set(d["ratios"])
    assert "best_policy" not in d and not any(k.startswith("best_policy") for k in d["ratios"])   # no pick after the run
    paired = d["paired_ratios"]                            # each repeat against the same repeat of the peer
    assert paired["target_vs_llamacpp_q8"]["samples"] == [
        round(a["tok_s"] / b["tok_s"], 3) for a, b in zip([d["runs"]["target"]], [d["runs"]["llamacpp_q8_0"]])]
    assert set(paired) >= {"speculative_replayed_vs_target", "draft_vs_target"}
    assert d["projection"]["alpha"] == acc["judged_acceptance"] >= acc["acceptance"]     # judged, not drafted
    assert d["projection"]["alpha_kind"] == "accepted / judged" and "random weights" in acc["borrowed"]
    assert d["probe"]["bytes"] >= PROBE_LLC_MULTIPLE * d["machine"]["llc"]["bytes"]
    assert d["gguf"] and (tmp_path / "gguf" / d["gguf"]).is_file()
    assert not _my_children()
    # the same rounds read back from a results file replay the same decisions; an older file without rounds projects
    f = tmp_path / "bench.json"
    f.write_text(json.dumps({"gamma": 4, "prompts": 1, "max_new_tokens": 4, "checkpoint": str(small),
                             "runs": {"speculative": {"acceptance": 0.5, "tokens_per_round": 2.0}}}))
    d = shape_mod.bench_shape(_shape_args(acceptance_from=str(f), peer=["none"]), TINY, "tiny", str(small), "test")
    assert d["speculative_method"] == "projected" and set(d["runs"]) == {"target", "draft"}
    assert "replayed_speculative_vs_target" not in d["ratios"]     # α from its 2.0 tokens a round at γ = 4, not 0.5
    assert d["projection"]["alpha"] == alpha_from_tokens_per_round(2.0, 4) > 0.5, d["projection"]


def test_the_projection_takes_the_judged_acceptance_and_never_drafted_where_the_round_length_is_known():
    """Rounds: their judged acceptance; no rounds but tokens per round: the α that round length implies
    (E(α) = (1 - α^(γ+1)) / (1 - α)); neither: accepted / drafted, and its kind says so."""
    assert shape_mod.projection_alpha({"judged_acceptance": 0.8, "acceptance": 0.6, "tokens_per_round": 3.0}, 4) == \
        (0.8, "accepted / judged")
    alpha, kind = shape_mod.projection_alpha({"judged_acceptance": None, "acceptance": 0.6, "tokens_per_round": 3.0}, 4)
    assert abs(expected_tokens(alpha, 4) - 3.0) < 1e-3 and alpha > 0.6 and "tokens per round" in kind
    none = {"judged_acceptance": None, "acceptance": 0.6, "tokens_per_round": None}
    assert shape_mod.projection_alpha(none, 4)[0] == 0.6


def test_passes_only_times_each_r4_layout_in_a_process_of_its_own():
    """--passes-only at a shape whose legacy and online R4 differ (448: (224, 2) and (28, 16)): one fresh process per
    layout, pass times for every width and view, the ratios speculation depends on."""
    from edge.analysis.bench.passes import bench_passes
    d = bench_passes(replace(TINY, intermediate_size=448), "tiny", ["online", "legacy", "none"], 1, 1, 1, "auto", 4)
    lay = d["layouts"]
    assert [lay[k]["r4_factors"] for k in ("online", "legacy", "none")] == [[28, 16], [224, 2], None]
    pids = [v["pid"] for v in lay.values()]
    assert len(set(pids)) == 3 and os.getpid() not in pids and not _my_children()
    for v in lay.values():
        assert set(v["ms"]) == {"draft", "target"} and set(v["ms"]["target"]) == {str(w) for w in range(1, 9)}
        assert v["verification_pass_vs_target_pass"] == v["target_pass_vs_1"]["5"] > 0
        assert v["draft_pass_vs_target_pass"] > 0


# -- bad input ----------------------------------------------------------------------------------------------------
def test_an_unknown_shape_is_one_line_naming_the_known_ones(capsys):
    rc, out, err = _cli(capsys, "--shape", "smollm2-7b")
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err
    assert "smollm2-7b" in lines[0] and "smollm2-360m" in lines[0] and "smollm2-1.7b" in lines[0]


@pytest.mark.parametrize("argv, says", [
    (["--shape", "smollm2-360m", "--peer", "hf"], "no transformers peer"),
    (["--shape", "smollm2-360m", "--peer", "llamacpp-native"], "--passes-only --peer llamacpp-native"),
    (["--shape", "smollm2-360m", "--policy", "target"], "leave out --policy"),
    (["--acceptance-from", "x.json"], "goes with --shape"),
    (["--passes-only"], "go with --shape"),
    (["--shape", "qwen2.5-1.5b", "--r4", "legacy"], "--r4 goes with --passes-only"),
    (["--shape", "smollm2-360m", "--acceptance-from", "/nonexistent/bench.json"], "no such file"),
])
def test_bad_bench_options_are_one_line(small, capsys, argv, says):
    rc, out, err = _cli(capsys, "--checkpoint", small, *argv)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and says in lines[0] and "Traceback" not in err, err


def test_a_shape_llamacpp_cannot_take_is_refused_before_any_work():
    """Every preset has a synthetic GGUF; a family llama.cpp's writer lacks is refused before the checkpoint is read."""
    from edge.errors import BitNestError
    with pytest.raises(BitNestError, match=r"--shape tiny-gemma: no llama.cpp peer \(.*not gemma\): use --peer none"):
        shape_mod.bench_shape(_shape_args(), replace(TINY, family="gemma"), "tiny-gemma", "/nonexistent/checkpoint")


def test_a_runner_that_cannot_load_is_one_line_and_leaves_no_process(small, capsys):
    """The TensorRT backend cannot run here: its runner's process reports it, every worker is closed."""
    rc, out, err = _cli(capsys, "--checkpoint", small, "--backend", "tensorrt", "--policy", "target", "--peer", "none",
                        "--prompts", 1, "--max-new-tokens", 4, "--repeats", 1)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "bench runner target" in lines[0] and "Traceback" not in err, err
    assert not _my_children()


def test_default_policies_include_auto_where_the_registry_has_it():
    from edge.decode.registry import POLICIES
    assert ("auto" in DEFAULT_POLICIES) == ("auto" in POLICIES)


def test_the_workers_are_ready_before_any_runner_loads():
    """Every worker has finished its imports (its ready line, its own pid) when Workers returns, so the first runner
    to load (the auto policy, which times its pass costs while loading) does not share the machine with the rest's
    imports."""
    from edge.analysis.bench.process import Workers
    with Workers(["target", "auto", "hf_fp32"]) as workers:
        assert [w.ready_pid for w in workers.values()] == [w.pid for w in workers.values()]
    assert not _my_children()


def test_a_runner_killed_by_the_system_is_named_with_its_signal_not_a_broken_pipe():
    """A runner the out-of-memory killer takes (SIGKILL, sent here to a real worker process) is one error naming the
    runner, the signal and the likely cause, and closing the workers afterwards raises nothing (a dead worker's
    unflushed request once surfaced as `bench.py: error: Broken pipe`)."""
    import os
    import signal
    from edge.analysis.bench.process import Workers
    from edge.errors import BitNestError
    with pytest.raises(BitNestError) as err:
        with Workers(["target", "hf_fp32"]) as workers:
            os.kill(workers["hf_fp32"].pid, signal.SIGKILL)
            workers["hf_fp32"].proc.wait()
            workers["hf_fp32"].request("load", kind="probe", buffer_bytes=1 << 20)
    assert "bench runner hf_fp32 (pid" in str(err.value) and "killed by SIGKILL" in str(err.value), err.value
    assert "out-of-memory killer" in str(err.value)
    assert not _my_children()


def test_the_memory_plan_groups_runners_that_do_not_fit_together_and_skips_one_that_cannot_fit(small):
    """Each runner's resident bytes come from the files it loads (the checkpoint's weight files, a GGUF, the float32
    model, the probe's buffer); within a budget they are grouped first-fit in order, and one over it alone is skipped
    with its reason; a budget no policy fits is one error."""
    from edge.analysis.bench.memory import LOAD_BYTES, MARGIN, memory_plan, resident_bytes, worker_base_bytes
    from edge.errors import BitNestError
    from edge.model.manifest import read_manifest, weight_files
    from export.sources import default_gguf
    policy = {"kind": "policy", "checkpoint": str(small)}
    specs = {"probe": {"kind": "probe", "nbytes": 64 << 20}, "target": policy, "speculative": policy,
             "hf_fp32": {"kind": "hf"}}
    weights = sum((small / f).stat().st_size for f in weight_files(small, read_manifest(small)))
    assert resident_bytes(policy, str(small)) == int((worker_base_bytes() + LOAD_BYTES + weights) * MARGIN)
    need = {n: resident_bytes(s, str(small)) for n, s in specs.items()}
    assert need["hf_fp32"] > need["target"] > weights            # float32 of every parameter, past the 8-bit planes
    gguf = default_gguf()                                         # transformers dequantizing a GGUF holds it too
    extra = resident_bytes({"kind": "hf", "gguf": str(gguf)}, str(small)) - need["hf_fp32"]
    assert abs(extra - gguf.stat().st_size * MARGIN) <= 2                   # (each need is rounded down)
    roomy = memory_plan(specs, str(small), sum(need.values()))
    assert roomy["groups"] == [list(specs)] and roomy["skipped"] == {} and roomy["runners"] == need
    assert memory_plan(specs, str(small), need["probe"] + need["target"])["groups"][:2] == [
        ["probe", "target"], ["speculative"] + ["hf_fp32"] * (need["speculative"] + need["hf_fp32"] <=
                                                               need["probe"] + need["target"])]
    tight = memory_plan(specs, str(small), max(need["probe"], need["target"]))    # no two fit together
    assert tight["groups"] == [["probe"], ["target"], ["speculative"]] and list(tight["skipped"]) == ["hf_fp32"]
    assert "GiB resident alone" in tight["skipped"]["hf_fp32"]
    with pytest.raises(BitNestError, match="runtime's runners need .* --memory-mib"):
        memory_plan(specs, str(small), need["target"] - 1)
    with pytest.raises(BitNestError, match="read probe needs .* --memory-mib"):
        memory_plan({"probe": specs["probe"]}, str(small), need["probe"] - 1)


def test_a_bench_whose_runners_do_not_fit_together_runs_them_in_groups(small, capsys, tmp_path, monkeypatch):
    """--memory-mib below the probe and the target together: each loads and runs in a group of its own, one after
    the other, and the run completes with every figure, the plan in its JSON and one line saying so. The workers'
    processes hold 256 MB more than this one's before they load anything (a sitecustomize on their PYTHONPATH stands
    for torch's CUDA build, a Jetson's, which holds ~450 MB more than the CPU build): the plan measures that and the
    target's peak stays within it, where a constant of the CPU build's planned it 200 MB short."""
    from edge.analysis.bench.common import default_threads, probe_spec
    from edge.analysis.bench.memory import MiB, resident_bytes, worker_base_bytes
    (tmp_path / "sitecustomize.py").write_text("HELD = bytearray(b'1') * (256 << 20)   # written: resident\n")
    light = worker_base_bytes()
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert worker_base_bytes() - light >= 250 * MiB
    probe = resident_bytes(probe_spec(machine(default_threads())), str(small))
    target = resident_bytes({"kind": "policy", "checkpoint": str(small)}, str(small))
    budget = max(probe, target) // MiB + 1
    assert budget * MiB < probe + target
    rc, out, err = _cli(capsys, "--checkpoint", small, "--policy", "target", "--peer", "none", "--prompts", 1,
                        "--max-new-tokens", 4, "--repeats", 1, "--pass-repeats", 1, "--memory-mib", budget, "--json")
    assert rc == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    plan = result["memory_plan"]
    assert plan["groups"] == [["probe"], ["target"]] and list(result["runs"]) == ["target"]
    assert 0 < plan["peak_rss_after_load"]["target"] <= plan["runners"]["target"], plan     # the plan's bound held
    assert result["read_gbps"] > 0 and result["runs"]["target"]["tok_s"] > 0 and result["pass_times"]["ms"]["target"]
    assert "2 groups, one after another" in err and not _my_children()
