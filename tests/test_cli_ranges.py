"""Every numeric option of every `bitnest` command has its range checked while parsing, against bounds written down
here (BOUNDS: not read from edge.argtypes, so loosening an option's bound in the code fails this file): the parsers
are walked (each command module's `parser()`), the options that convert a value are exactly the table's, every one
uses a range-checked type (edge.argtypes.Number), each bound the table closes is accepted, and each value just past a
bound, a non-number and nan are refused with one line on stderr and exit code 2, in this process, before any work."""

import argparse
import importlib
import math

import pytest

from edge.argtypes import Number
from export import commands

PARSERS = {name: importlib.import_module(commands.command_module(name)).parser for name in commands.COMMANDS}

# command -> option -> "KIND [lo, hi]" ("(" / ")": that end excluded; inf: unbounded; "none": the word none is taken)
BOUNDS = {
    "chat": {"--gamma": "int [1, 16]", "--max-context": "int [2, inf)", "--kv-window": "int [0, inf)",
        "--kv8-draft-below": "int [0, inf)", "--recent": "int [1, inf)", "--shortlist-k": "int [1, inf)",
        "--draft-vocab": "int [1, inf)", "--gate-threshold": "float [0.0, inf)", "--gate-rate": "float [0.0, 1.0]",
        "--gate-seed": "int [0, inf)", "--adaptive-stop": "float [0.0, inf)",
        "--adaptive-extend": "float [0.0, inf) none", "--gamma-max": "int [1, 16]", "--interval-ms": "int [1, inf)",
        "--idle-seconds": "float [0.0, inf)", "--temperature": "float [0.0, inf)", "--top-k": "int [0, inf)",
        "--top-p": "float (0.0, 1.0]", "--seed": "int [0, inf)", "--max-new-tokens": "int [1, inf)"},
    "serve": {"--gamma": "int [1, 16]", "--max-context": "int [2, inf)", "--kv-window": "int [0, inf)",
        "--kv8-draft-below": "int [0, inf)", "--recent": "int [1, inf)", "--shortlist-k": "int [1, inf)",
        "--draft-vocab": "int [1, inf)", "--gate-threshold": "float [0.0, inf)", "--gate-rate": "float [0.0, 1.0]",
        "--gate-seed": "int [0, inf)", "--adaptive-stop": "float [0.0, inf)",
        "--adaptive-extend": "float [0.0, inf) none", "--gamma-max": "int [1, 16]", "--interval-ms": "int [1, inf)",
        "--idle-seconds": "float [0.0, inf)", "--port": "int [0, 65535]", "--max-queue": "int [0, inf)",
        "--max-tokens": "int [1, inf)", "--time-limit": "float (0.0, inf)", "--header-timeout": "float (0.0, inf)",
        "--body-timeout": "float (0.0, inf)", "--keep-alive": "float (0.0, inf)", "--sse-ping": "float (0.0, inf)",
        "--max-connections": "int [1, inf)"},
    "export": {"--group-size": "int [2, inf)", "--damp": "float (0.0, inf)", "--base-trust": "float [0.0, inf) none",
        "--calib-samples": "int [1, inf)", "--calib-seq-len": "int [16, inf)", "--head-block-rows": "int [1, inf)",
        "--shortlist-k": "int [1, inf)", "--draft-vocab": "int [1, inf)", "--seed": "int [0, inf)",
        "--rotation-steps": "int [1, inf)", "--rotation-samples": "int [2, inf)",
        "--rotation-seq-len": "int [16, inf)", "--rotation-lr": "float (0.0, inf)",
        "--rotation-target-weight": "float [0.0, inf)", "--max-context": "int [2, inf)",
        "--max-tokens": "int [1, inf)"},
    "evaluate": {"--tokens": "int [2, inf)", "--window": "int [2, inf)", "--shortlist-k": "int [1, inf)"},
    "draft-layers": {"--tokens": "int [2, inf)", "--most": "int [1, inf)", "--gamma-max": "int [1, 8]"},
    "bench": {"--prompts": "int [1, inf)", "--max-new-tokens": "int [2, inf)", "--gamma": "int [1, 16]",
        "--repeats": "int [1, inf)", "--threads": "int [1, inf)", "--pass-repeats": "int [1, inf)",
        "--rounds": "int [1, inf)", "--prefill": "int [0, inf)", "--shortlist-k": "int [1, inf)",
        "--draft-vocab": "int [1, inf)", "--gate-threshold": "float [0.0, inf)", "--gate-rate": "float [0.0, 1.0]", "--gate-seed": "int [0, inf)",
        "--adaptive-stop": "float [0.0, inf)", "--adaptive-extend": "float [0.0, inf) none",
        "--gamma-max": "int [1, 16]", "--memory-mib": "int [1, inf)"},
    "lossless": {"--prompts": "int [1, inf)", "--code-prompts": "int [0, inf)", "--max-new-tokens": "int [1, inf)",
        "--gamma": "int [1, 16]", "--shortlist-k": "int [1, inf)", "--draft-vocab": "int [1, inf)"},
    "max-context": {"--gamma": "int [1, 16]", "--prefill-chunk": "int [1, inf)", "--kv-window": "int [1, inf)",
        "--total-mib": "float (0.0, inf)", "--os-reserve-mib": "float [0.0, inf)",
        "--context-reserve-mib": "float [0.0, inf)"},
    "weights-memory": {"--prompts": "int [1, inf)", "--max-new-tokens": "int [1, inf)"},
    "joules": {"--prompts": "int [1, inf)", "--max-new-tokens": "int [1, inf)", "--gamma": "int [1, 16]",
        "--idle-seconds": "float [0.0, inf)", "--interval-ms": "int [1, inf)", "--shortlist-k": "int [1, inf)",
        "--draft-vocab": "int [1, inf)"},
    "selfcheck": {"--tokens": "int [1, inf)", "--triton-timeout": "int [1, inf)"},
    "calibrate": {"--shortlist-k": "int [1, inf)", "--draft-vocab": "int [1, inf)", "--prompts": "int [1, inf)",
        "--max-new-tokens": "int [1, inf)"},
    "replay": {"--shortlist-k": "int [1, inf)", "--draft-vocab": "int [1, inf)", "--prompts": "int [1, inf)",
        "--max-new-tokens": "int [1, inf)", "--resamples": "int [1, inf)", "--seed": "int [0, inf)"},
    "compare": {"--shortlist-k": "int [1, inf)", "--draft-vocab": "int [1, inf)", "--prompts": "int [1, inf)",
        "--max-new-tokens": "int [1, inf)", "--match-tokens": "int [1, inf)", "--phase-prompts": "int [0, inf)",
        "--phase-tokens": "int [1, inf)", "--gamma": "int [1, 16]", "--resamples": "int [1, inf)",
        "--seed": "int [0, inf)", "--gate-threshold": "float [0.0, inf)", "--gate-rate": "float [0.0, 1.0]",
        "--gate-seed": "int [0, inf)", "--adaptive-stop": "float [0.0, inf)",
        "--adaptive-extend": "float [0.0, inf) none", "--gamma-max": "int [1, 16]"},
    "export-memory": {"--layers": "int [1, inf)", "--calib-samples": "int [1, inf)",
        "--calib-seq-len": "int [16, inf)"},
    "quality-table": {"--tokens": "int [2, inf)"},
    "verify-onnx": {"--prompts": "int [1, inf)", "--max-prompt-tokens": "int [1, inf)",
        "--new-tokens": "int [0, inf)", "--chunk": "int [1, inf)"},
    "compile-kernels": {"--ptx-version": "int [10, inf)", "--sms": "int [1, inf)"},
    "bench-kernels": {"--repeats": "int [1, inf)"},
    "gemv-sweep": {"--repeats": "int [1, inf)"},
    "device-check": {"--repeats": "int [1, inf)", "--new-tokens": "int [1, inf)"},
    "replay-tegrastats": {"--interval-ms": "int [1, inf)", "--lines": "int [0, inf)", "--exit-after": "int [0, inf)",
        "--exit-code": "int [0, 255]"},
    "fuzz-inputs": {"--cases": "int [1, inf)", "--seed": "int [0, inf)", "--seconds": "float (0.0, inf)",
        "--kills": "int [0, inf)"},
}


def spec(text: str) -> tuple[type, float, float, bool, bool, bool]:
    """(kind, lo, hi, open_lo, open_hi, takes_none) of a BOUNDS entry."""
    kind, interval, *rest = text.split(" ", 2)
    lo, hi = interval[1:], rest[0].split(" ")[0][:-1]
    return ({"int": int, "float": float}[kind], float(lo[:-1]), float(hi), interval[0] == "(",
            rest[0].split(" ")[0][-1] == ")", rest[0].endswith("none"))


def typed_options():
    for name, make in PARSERS.items():
        for action in make()._actions:
            if action.type is not None:
                yield name, action


def written(kind: type, v: float) -> str:
    return str(int(v)) if kind is int else repr(v)


def past_bounds(text: str) -> list[str]:
    """What a user could type just past each end of the entry's interval, then values of the wrong kind."""
    kind, lo, hi, open_lo, open_hi, _ = spec(text)
    step = lambda v: 1 if kind is int else max(1.0, abs(v)) * 1e-3
    out = [] if math.isinf(lo) else [written(kind, lo if open_lo else lo - step(lo))]
    out += [] if math.isinf(hi) else [written(kind, hi if open_hi else hi + step(hi))]
    return out + (["nan", "inf", "x"] if kind is float else ["1.5", "x"])


def inside(text: str) -> list[str]:
    """The closed ends of the entry's interval and a value between its ends."""
    kind, lo, hi, open_lo, open_hi, takes_none = spec(text)
    ends = [v for v, is_open in ((lo, open_lo), (hi, open_hi)) if not is_open and not math.isinf(v)]
    a, b = (lo if not math.isinf(lo) else min(hi, 0) - 1000), (hi if not math.isinf(hi) else max(lo, 0) + 1000)
    middle = (a + b) / 2 if kind is float else (a + b) // 2
    return [written(kind, v) for v in ends + [middle]] + (["none"] if takes_none else [])


def test_the_table_names_every_typed_option_and_each_is_range_checked():
    typed = {(name, a.option_strings[0]): a for name, a in typed_options()}
    table = {(name, option) for name, options in BOUNDS.items() for option in options}
    assert sorted(set(typed) - table) == [], "numeric options the table does not bound: add them to BOUNDS"
    assert sorted(table - set(typed)) == [], "BOUNDS names options no parser has"
    assert [k for k, a in typed.items() if not isinstance(a.type, Number)] == []


def test_defaults_are_in_range():
    values = lambda d: d if isinstance(d, list) else [d]          # nargs options default to a list
    bad = [f"{name} {a.option_strings[0]}={a.default!r}" for name, a in typed_options()
           if a.default is not None and any(a.type(str(v)) != v for v in values(a.default))]
    assert bad == []


def test_each_closed_bound_and_a_value_inside_are_accepted():
    refused = []
    for name, a in typed_options():
        for value in inside(BOUNDS[name][a.option_strings[0]]):
            try:
                a.type(value)
            except argparse.ArgumentTypeError as e:
                refused.append(f"{name} {a.option_strings[0]} {value}: {e}")
    assert refused == []


@pytest.mark.parametrize("name", list(PARSERS))
def test_out_of_range_values_are_one_line_errors(name, capsys):
    for action in (a for n, a in typed_options() if n == name):
        option = action.option_strings[0]
        for value in past_bounds(BOUNDS[name][option]):
            with pytest.raises(argparse.ArgumentTypeError):   # first alone: an accepted value would run the command
                action.type(value)
            with pytest.raises(SystemExit) as e:
                commands.main([name, option, value])
            err = capsys.readouterr().err
            lines = err.strip().splitlines()
            assert e.value.code == 2 and len(lines) == 1 and "Traceback" not in err, (name, option, value, err)
            assert f"error: argument {option}: " in lines[0] and action.type.describe() in lines[0], lines[0]


def test_chat_refuses_a_negative_recent_window(capsys):
    """The one bad input of the 37 a new user tried that `bitnest chat` accepted silently."""
    with pytest.raises(SystemExit) as e:
        commands.main(["chat", "--prompt", "Hi.", "--recent", "-1"])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("chat.py: error: argument --recent: -1 is out of range: pass an integer >= 1 "
                                       "(chat.py --help lists the options)\n")
