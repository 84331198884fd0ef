"""The server's counters and their Prometheus text exposition (format 0.0.4): requests by route template and status
(a path no route matches is `unmatched`, so the series are bounded), prompt and completion tokens, answers by finish
reason, prefill and decode time, speculation under vLLM's names (acceptance per draft position too), J/token where a
meter ran, queue length, and the latency histograms vLLM and llama-server users chart (time to first token, time per
output token, queue time, end-to-end latency). Updated on the event loop only (no lock)."""

import bisect
import math
from collections import Counter

from edge.llm import Answer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNMATCHED = "unmatched"
# bucket upper bounds (seconds), vLLM's for these histograms
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                   40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                 80.0)


def _label(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(v: float) -> str:
    if v is None or isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, float) and math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if isinstance(v, float) else str(v)


class Histogram:
    """Observations counted into cumulative buckets (`le`), with their sum and count."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds, self.counts = bounds, [0] * (len(bounds) + 1)
        self.sum, self.count = 0.0, 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1

    def samples(self, name: str) -> list[tuple[str, dict, float]]:
        out, running = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts):
            running += n
            out.append((f"{name}_bucket", {"le": _num(float(bound))}, running))
        return out + [(f"{name}_sum", {}, self.sum), (f"{name}_count", {}, self.count)]


class Metrics:
    def __init__(self):
        self.requests: Counter = Counter()        # (route template, status) -> requests answered
        self.finished: Counter = Counter()        # finish reason -> generations
        self.prompt_tokens = self.completion_tokens = 0
        self.prefill_seconds = 0.0
        self.decode_tokens, self.decode_seconds = 0, 0.0
        self.drafts = self.drafted = self.accepted = 0
        self.accepted_per_pos: Counter = Counter()   # draft position -> proposals accepted there
        self.metered_tokens, self.joules = 0, 0.0
        self.ttft, self.e2e = Histogram(LATENCY_BUCKETS), Histogram(LATENCY_BUCKETS)
        self.queue_time, self.tpot = Histogram(LATENCY_BUCKETS), Histogram(TOKEN_BUCKETS)

    def request(self, route: str, status: int) -> None:
        self.requests[(route, status)] += 1

    def answered(self, a: Answer, queue_seconds: float, seconds: float) -> None:
        """One generation: its answer, its wait for the engine and its time from arrival to its last token."""
        st = a.stats
        self.finished[a.finish_reason] += 1
        self.prompt_tokens += a.prompt_tokens
        self.completion_tokens += len(a.tokens)
        self.prefill_seconds += st.prefill_seconds
        self.decode_tokens += st.tokens
        self.decode_seconds += st.decode_seconds
        self.drafts += st.rounds - st.gammas.get(0, 0)     # rounds that drafted (auto's γ = 0 steps draft nothing)
        self.drafted += st.drafted
        self.accepted += st.accepted
        self.accepted_per_pos.update(dict(enumerate(st.accepted_per_pos)))
        joules = st.extra.get("joules")
        if joules is not None:
            self.joules += joules
            self.metered_tokens += st.tokens
        self.queue_time.observe(queue_seconds)
        self.ttft.observe(queue_seconds + st.prefill_seconds)
        if st.tokens:
            self.tpot.observe(st.decode_seconds / st.tokens)
        self.e2e.observe(seconds)

    def render(self, queued: int, running: int) -> str:
        """The exposition: counters, histograms, then gauges (NaN where there is nothing to divide yet)."""
        out = []

        def metric(name, kind, help_, samples):
            out.append(f"# HELP bitnest_{name} {help_}")
            out.append(f"# TYPE bitnest_{name} {kind}")
            for labels, v in samples:
                tag = "{" + ",".join(f'{k}="{_label(x)}"' for k, x in labels.items()) + "}" if labels else ""
                out.append(f"bitnest_{name}{tag} {_num(v)}")

        def histogram(name, help_, h: Histogram):
            out.append(f"# HELP bitnest_{name} {help_}")
            out.append(f"# TYPE bitnest_{name} histogram")
            for sample, labels, v in h.samples(name):
                tag = "{" + ",".join(f'{k}="{x}"' for k, x in labels.items()) + "}" if labels else ""
                out.append(f"bitnest_{sample}{tag} {_num(v)}")

        metric("requests_total", "counter", "HTTP requests answered, by route template and status (429: the queue "
               "was full; 499: the client left; route unmatched: no route has the path).",
               [({"route": r, "status": str(s)}, n) for (r, s), n in sorted(self.requests.items())])
        metric("generations_total", "counter", "Generations run, by finish reason (cancelled: the client left).",
               [({"finish_reason": f}, n) for f, n in sorted(self.finished.items())])
        metric("prompt_tokens_total", "counter", "Prompt tokens of the generations run.", [({}, self.prompt_tokens)])
        metric("completion_tokens_total", "counter", "New tokens of the generations run.",
               [({}, self.completion_tokens)])
        metric("prefill_seconds_total", "counter", "Wall time of the prefills.", [({}, self.prefill_seconds)])
        metric("decode_tokens_total", "counter", "Tokens of the decode phases (after each prefill's first token).",
               [({}, self.decode_tokens)])
        metric("decode_seconds_total", "counter", "Wall time of the decode phases.", [({}, self.decode_seconds)])
        metric("spec_decode_num_drafts_total", "counter", "Speculative rounds that drafted (vLLM's name).",
               [({}, self.drafts)])
        metric("spec_decode_num_draft_tokens_total", "counter", "Draft proposals verified (vLLM's name).",
               [({}, self.drafted)])
        metric("spec_decode_num_accepted_tokens_total", "counter", "Draft proposals the target accepted (vLLM's "
               "name).", [({}, self.accepted)])
        metric("spec_decode_num_accepted_tokens_per_pos_total", "counter", "Draft proposals accepted at each "
               "position of a round, 0 first (vLLM's name): position i counts the rounds that kept i + 1 or more.",
               [({"position": str(i)}, n) for i, n in sorted(self.accepted_per_pos.items())])
        metric("joules_total", "counter", "Energy of the metered decode phases.", [({}, self.joules)])
        histogram("time_to_first_token_seconds", "From arrival to the prefill's token: queue time plus prefill.",
                  self.ttft)
        histogram("time_per_output_token_seconds", "Decode time per decode token, one observation per answer.",
                  self.tpot)
        histogram("request_queue_time_seconds", "Wait for the engine.", self.queue_time)
        histogram("e2e_request_latency_seconds", "From arrival to the answer's last token.", self.e2e)
        ratio = lambda a, b: a / b if b else float("nan")
        metric("decode_tokens_per_second", "gauge", "Decode tokens per second over every decode phase so far.",
               [({}, ratio(self.decode_tokens, self.decode_seconds))])
        metric("acceptance_ratio", "gauge", "Accepted / drafted tokens so far (NaN: nothing drafted).",
               [({}, ratio(self.accepted, self.drafted))])
        metric("joules_per_token", "gauge", "Joules per decode token of the metered decode phases (NaN: no meter).",
               [({}, ratio(self.joules, self.metered_tokens))])
        metric("queue_length", "gauge", "Requests waiting for the engine.", [({}, queued)])
        metric("generation_running", "gauge", "1 while a generation runs on the engine.", [({}, running)])
        return "\n".join(out) + "\n"
