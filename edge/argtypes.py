"""Command-line numbers with their ranges: the argparse `type` of every numeric option (an out-of-range or
non-numeric value is refused while parsing, in one line that says what is wrong and what to pass), and the parser
class every command builds, whose errors are that one line and exit code 2 (no usage block)."""

import argparse
import math
import sys

from edge.engine import MAX_PROPOSALS


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, `PROG: error: MESSAGE (PROG --help lists the options)`, exit 2."""

    def error(self, message):
        print(f"{self.prog}: error: {message} ({self.prog} --help lists the options)", file=sys.stderr)
        sys.exit(2)


class Number:
    """An argparse type: an int or a finite float within [lo, hi] (an end None: unbounded; `open_lo` / `open_hi`:
    that end excluded), or None for the word `none` where `none` says what it means. `outside()` gives values just
    past each bound (tests walk them)."""

    def __init__(self, kind: type, lo=None, hi=None, open_lo: bool = False, open_hi: bool = False,
                 none: str | None = None):
        self.kind, self.lo, self.hi, self.open_lo, self.open_hi, self.none = kind, lo, hi, open_lo, open_hi, none
        self.__name__ = "integer" if kind is int else "number"      # argparse names the type in its messages

    def describe(self) -> str:
        what = "an integer" if self.kind is int else "a number"
        lo = None if self.lo is None else f"{'>' if self.open_lo else '>='} {self.lo}"
        hi = None if self.hi is None else f"{'<' if self.open_hi else '<='} {self.hi}"
        bounds = " and ".join(b for b in (lo, hi) if b)
        return f"{what}{' ' + bounds if bounds else ''}" + (f", or none ({self.none})" if self.none else "")

    def __call__(self, text: str):
        if self.none is not None and text.strip().lower() == "none":
            return None
        try:
            value = self.kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {self.describe()}: pass {self.describe()}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not finite: pass {self.describe()}")
        below = self.lo is not None and (value < self.lo or (self.open_lo and value == self.lo))
        above = self.hi is not None and (value > self.hi or (self.open_hi and value == self.hi))
        if below or above:
            raise argparse.ArgumentTypeError(f"{text} is out of range: pass {self.describe()}")
        return value

    def outside(self) -> list[str]:
        """Values just past each bound, as a user would type them."""
        step = 1 if self.kind is int else (abs(self.lo or self.hi or 1) * 1e-3 or 1e-3)
        out = []
        if self.lo is not None:
            out.append(str(self.lo if self.open_lo else self.lo - step))
        if self.hi is not None:
            out.append(str(self.hi if self.open_hi else self.hi + step))
        return out + ["nan", "x"] if self.kind is float else out + ["1.5", "x"]


def count(lo: int = 1, hi: int | None = None) -> Number:
    """An integer count, at least `lo` (1 by default)."""
    return Number(int, lo, hi)


def seed() -> Number:
    return Number(int, 0)


def gamma() -> Number:
    """Draft tokens per speculative round (GenerateConfig's bound)."""
    return Number(int, 1, MAX_PROPOSALS)


def at_least(lo: float = 0.0, none: str | None = None) -> Number:
    """A finite number >= lo (0 by default)."""
    return Number(float, lo, none=none)


def positive() -> Number:
    """A finite number > 0."""
    return Number(float, 0.0, open_lo=True)


def unit(open_lo: bool = False) -> Number:
    """A number in [0, 1] ((0, 1] with open_lo)."""
    return Number(float, 0.0, 1.0, open_lo=open_lo)
