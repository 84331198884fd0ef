"""The server's counters and their Prometheus text exposition (format 0.0.4): requests by route and status,
prompt and completion tokens, answers by finish reason, decode tok/s, speculation acceptance, J/token where a meter
ran, queue length. Updated on the event loop only (no lock)."""

import math
from collections import Counter

from edge.llm import Answer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(v: float) -> str:
    if v is None or isinstance(v, float) and math.isnan(v):
        return "NaN"
    return repr(float(v)) if isinstance(v, float) else str(v)


class Metrics:
    def __init__(self):
        self.requests: Counter = Counter()        # (route, status) -> requests answered
        self.finished: Counter = Counter()        # finish reason -> generations
        self.prompt_tokens = self.completion_tokens = 0
        self.decode_tokens, self.decode_seconds = 0, 0.0
        self.drafted = self.accepted = 0
        self.metered_tokens, self.joules = 0, 0.0

    def request(self, route: str, status: int) -> None:
        self.requests[(route, status)] += 1

    def answered(self, a: Answer) -> None:
        st = a.stats
        self.finished[a.finish_reason] += 1
        self.prompt_tokens += a.prompt_tokens
        self.completion_tokens += len(a.tokens)
        self.decode_tokens += st.tokens
        self.decode_seconds += st.decode_seconds
        self.drafted += st.drafted
        self.accepted += st.accepted
        joules = st.extra.get("joules")
        if joules is not None:
            self.joules += joules
            self.metered_tokens += st.tokens

    def render(self, queued: int, running: int) -> str:
        """The exposition: counters, then gauges (NaN where there is nothing to divide yet)."""
        out = []

        def metric(name, kind, help_, samples):
            out.append(f"# HELP bitnest_{name} {help_}")
            out.append(f"# TYPE bitnest_{name} {kind}")
            for labels, v in samples:
                tag = "{" + ",".join(f'{k}="{_label(x)}"' for k, x in labels.items()) + "}" if labels else ""
                out.append(f"bitnest_{name}{tag} {_num(v)}")

        metric("requests_total", "counter", "HTTP requests answered, by route and status (429: the queue was full).",
               [({"route": r, "status": str(s)}, n) for (r, s), n in sorted(self.requests.items())])
        metric("generations_total", "counter", "Generations run, by finish reason (cancelled: the client left).",
               [({"finish_reason": f}, n) for f, n in sorted(self.finished.items())])
        metric("prompt_tokens_total", "counter", "Prompt tokens of the generations run.", [({}, self.prompt_tokens)])
        metric("completion_tokens_total", "counter", "New tokens of the generations run.",
               [({}, self.completion_tokens)])
        metric("decode_tokens_total", "counter", "Tokens of the decode phases (after each prefill's first token).",
               [({}, self.decode_tokens)])
        metric("decode_seconds_total", "counter", "Wall time of the decode phases.", [({}, self.decode_seconds)])
        metric("drafted_tokens_total", "counter", "Draft proposals verified.", [({}, self.drafted)])
        metric("accepted_tokens_total", "counter", "Draft proposals the target accepted.", [({}, self.accepted)])
        metric("joules_total", "counter", "Energy of the metered decode phases.", [({}, self.joules)])
        ratio = lambda a, b: a / b if b else float("nan")
        metric("decode_tokens_per_second", "gauge", "Decode tokens per second over every decode phase so far.",
               [({}, ratio(self.decode_tokens, self.decode_seconds))])
        metric("acceptance", "gauge", "Accepted / drafted tokens so far (NaN: nothing drafted).",
               [({}, ratio(self.accepted, self.drafted))])
        metric("joules_per_token", "gauge", "Joules per decode token of the metered decode phases (NaN: no meter).",
               [({}, ratio(self.joules, self.metered_tokens))])
        metric("queue_length", "gauge", "Requests waiting for the engine.", [({}, queued)])
        metric("generation_running", "gauge", "1 while a generation runs on the engine.", [({}, running)])
        return "\n".join(out) + "\n"
