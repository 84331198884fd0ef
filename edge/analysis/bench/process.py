"""One benchmark runner per process: the parent's `Worker` starts `python -m edge.analysis.bench.process`, which loads
one runner (edge.analysis.bench.runners) and answers requests, one JSON line each way, until told to quit. The parent
waits for each answer before it sends the next request, so only one runner works at a time; `interleave` takes the
repeats in turns across the workers, so drift in the machine's speed falls on every runner alike.

Protocol (stdin -> stdout of the worker, one JSON object per line):
    (nothing)                            ->  {"ready": pid}        (once, when its imports are done)
    {"op": "load", "kind": K, ...spec}  ->  {"result": {"pid": ..., "peak_rss_bytes": ..., ...what the runner
                                             reports of itself}}
    {"op": OP, ...arguments}             ->  {"result": {...}}    (OP one of the runner's OPS)
    {"op": "quit"}                       ->  the worker exits
A failure answers {"error": "one line"}. The worker keeps its real stdout for the protocol alone: anything a library
prints there (llama.cpp logs) goes to its stderr, which the parent keeps in a log file and quotes if it dies.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from edge.errors import BitNestError

ROOT = Path(__file__).resolve().parents[3]    # the checkout the worker must import (not an installed copy)


def worker_env() -> dict:
    """This process's environment with the checkout first on PYTHONPATH, so a worker runs the same code."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


class Worker:
    """A runner in its own fresh process (started at construction; `load` gives it its spec)."""

    def __init__(self, name: str):
        self.name = name
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "edge.analysis.bench.process"], cwd=ROOT,
                                     env=worker_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, bufsize=1)
        self.pid = self.proc.pid
        self.ready_pid = None

    def request(self, op: str, **args) -> dict:
        """Send one request and wait for its answer; BitNestError naming this runner where it fails or dies."""
        try:
            self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass                                       # read what is there: a dead worker answers nothing
        msg = self._answer(op)
        if "error" in msg:
            raise BitNestError(f"bench runner {self.name}: {msg['error']}")
        return msg["result"]

    def wait_ready(self) -> None:
        """Wait until the worker's imports are done (its first line, its pid: `ready_pid`)."""
        self.ready_pid = self._answer("start")["ready"]

    def _answer(self, op: str) -> dict:
        try:
            line = self.proc.stdout.readline()
        except OSError:
            line = ""
        if not line:
            raise BitNestError(f"bench runner {self.name} (pid {self.pid}) exited during {op}: {self._last_log()}")
        return json.loads(line)

    def load(self, kind: str, **spec) -> dict:
        return self.request("load", kind=kind, **spec)

    def _last_log(self) -> str:
        """Why the worker stopped: the signal that killed it and its likely cause, or its exit code, after the
        last line it wrote."""
        try:
            self.proc.wait(timeout=5)                  # a pipe closes a moment before its process is reaped
        except subprocess.TimeoutExpired:
            pass
        self.log.seek(0)
        lines = [ln.strip() for ln in self.log.read().splitlines() if ln.strip()]
        last, code = (lines[-1][:300] if lines else "no output"), self.proc.returncode
        if code is None:
            return last
        if code >= 0:
            return f"{last} (exit code {code})"
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        why = (": likely the system's out-of-memory killer (the runners loaded together outgrew this host's memory; "
               "see dmesg, and time fewer runners at once, e.g. --peer none or one --policy)"
               if -code == signal.SIGKILL else "")
        return f"killed by {name}{why} (its last output: {last})"

    def close(self) -> None:
        """Ask the worker to quit; kill it where it does not within 30 s."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.log):
            try:
                f.close()
            except OSError:      # a dead worker's stdin still holding a request: its flush meets a broken pipe
                pass


class Workers(dict):
    """name -> Worker, every process started at once (imports overlap) and closed together on exit; the constructor
    returns once every worker's imports are done, and loading is one at a time (`load_all`), so a runner that times
    something while it loads (the `auto` policy's cost table) has the machine alone: one timed beside eight workers'
    imports put 1-, 2- and 3-token target passes at one cost, and `auto` chose γ = 2 in 127 of its 148 rounds."""

    def __init__(self, names):
        super().__init__()
        try:
            for name in names:
                self[name] = Worker(name)
            for w in self.values():
                w.wait_ready()
        except BaseException:
            self.close()
            raise

    def load_all(self, specs: dict) -> dict:
        """{name: what its runner reported on loading (its pid included)}."""
        return {name: self[name].load(**specs[name]) for name in specs}

    def interleave(self, repeats: int, op: str = "run") -> dict:
        """{name: [one result per repeat]}: repeat r of every runner, in turn, before repeat r + 1 of any."""
        out = {name: [] for name in self}
        for _ in range(repeats):
            for name, w in self.items():
                out[name].append(w.request(op))
        return out

    def close(self) -> None:
        for w in self.values():
            w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def serve(lines, reply) -> None:
    """The worker's loop: requests from `lines`, answers through `reply(dict)`."""
    runner = None
    for line in lines:
        msg = json.loads(line)
        op = msg.pop("op")
        if op == "quit":
            return
        try:
            if op == "load":
                from edge.analysis.bench.runners import make_runner
                from edge.memory.devices import process_rss_bytes
                runner = make_runner(msg)         # its peak resident bytes once loaded: the memory plan's check
                result = {"pid": os.getpid(), "peak_rss_bytes": process_rss_bytes("VmHWM"), **runner.info}
            elif runner is None or op not in runner.OPS:
                raise BitNestError(f"no runner op {op!r} here")
            else:
                result = getattr(runner, op)(**msg)
        except Exception as e:         # every failure is one answer line; the parent raises it by name
            text = str(e).strip().splitlines()
            reply({"error": f"{type(e).__name__}: {text[0][:300] if text else ''}" if not isinstance(e, BitNestError)
                   else text[0]})
            continue
        reply({"result": result})


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)                                  # stray prints of any library go to stderr, not the protocol
    sys.stdout = sys.stderr

    def reply(obj: dict) -> None:
        protocol.write(json.dumps(obj) + "\n")
        protocol.flush()

    import edge.analysis.bench.runners  # noqa: F401  (torch: imported while the other workers start, not in turn)
    reply({"ready": os.getpid()})
    serve(sys.stdin, reply)


if __name__ == "__main__":
    main()
