"""Replay recorded tegrastats lines on stdout at an interval, as `tegrastats --interval MS` would print
them: a stand-in source for the tegrastats meter (`--meter-command`) on machines without a Jetson.

    python scripts/replay_tegrastats.py FILE [--interval-ms MS] [--lines N] [--exit-after K] [--exit-code C]

The file's lines are replayed in order and repeated until --lines lines were printed (default: forever).
--exit-after K stops after K lines with --exit-code (a source that dies mid-run).
"""

import argparse
import itertools
import sys
import time
from pathlib import Path

from edge.argtypes import Parser, count


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="replay_tegrastats.py", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file")
    p.add_argument("--interval-ms", type=count(), default=1000, help="tegrastats' own default is 1000")
    p.add_argument("--lines", type=count(0), default=0, help="lines to print in all (0 = until killed)")
    p.add_argument("--exit-after", type=count(0), default=0, help="die after this many lines (0 = never)")
    p.add_argument("--exit-code", type=count(0, 255), default=1)
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    path = Path(a.file)
    if not path.is_file():
        print(f"replay_tegrastats.py: error: {a.file} does not exist", file=sys.stderr)
        return 2
    recorded = [line for line in path.read_text().splitlines() if line.strip()]
    if not recorded:
        print(f"replay_tegrastats.py: error: {a.file} holds no lines", file=sys.stderr)
        return 2
    for n, line in enumerate(itertools.cycle(recorded), 1):
        print(line, flush=True)
        if a.exit_after and n >= a.exit_after:
            return a.exit_code
        if a.lines and n >= a.lines:
            return 0
        time.sleep(a.interval_ms / 1000.0)
    return 0
