"""Every numeric option of every `bitnest` command has its range checked while parsing: the parsers are walked
(each command module's `parser()`), every option that converts its value must use a range-checked type
(edge.argtypes.Number), and each value just past a bound, a non-number and nan are refused with one line on stderr
and exit code 2, in this process, before any work."""

import importlib

import pytest

from edge.argtypes import Number
from export import commands

PARSERS = {name: importlib.import_module(cmd.module).parser for name, cmd in commands.COMMANDS.items()}


def numeric_options():
    for name, make in PARSERS.items():
        for action in make()._actions:
            if action.type is not None:
                yield name, action


def test_every_command_has_a_parser_and_every_typed_option_a_range():
    typed = list(numeric_options())
    unchecked = [f"{name} {a.option_strings[0]} ({a.type!r})" for name, a in typed if not isinstance(a.type, Number)]
    assert unchecked == []
    assert ("chat", "--recent") in {(name, a.option_strings[0]) for name, a in typed}
    assert len(typed) >= 100, len(typed)            # 19 commands; chat alone has 18


def test_defaults_are_in_range():
    values = lambda d: d if isinstance(d, list) else [d]          # nargs options default to a list
    bad = [f"{name} {a.option_strings[0]}={a.default!r}" for name, a in numeric_options()
           if a.default is not None and any(a.type(str(v)) != v for v in values(a.default))]
    assert bad == []


@pytest.mark.parametrize("name", list(PARSERS))
def test_out_of_range_values_are_one_line_errors(name, capsys):
    for action in (a for n, a in numeric_options() if n == name):
        option = action.option_strings[0]
        for value in action.type.outside():
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
