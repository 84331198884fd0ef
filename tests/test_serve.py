"""`bitnest serve` on 127.0.0.1, driven by the official openai client with an API key: greedy answers, whole and
streamed, equal the chat's token for token (the chat run in the same test session: what the model writes differs
across CPUs), usage agrees with the chat's stats, a bounded load answers every request or refuses it with 429 while
the server's RSS stays flat, a client that leaves ends its generation, and bad input gets OpenAI's error shape and a
4xx while the server serves on. One server for the module (`--max-queue 2`, the speculative policy: its rounds fill
the bitnest block; greedy speculation is the target's own output; its key from $BITNEST_API_KEY).
tests/test_serve_adversarial.py attacks a server of its own."""

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import ROOT

openai = pytest.importorskip("openai", reason="the test extra brings the openai client: pip install -e .[test]")
pytest.importorskip("starlette", reason="bitnest serve needs the serve extra: pip install -e .[serve]")
pytest.importorskip("uvicorn", reason="bitnest serve needs the serve extra: pip install -e .[serve]")
import httpx  # noqa: E402  (openai's own HTTP client)

PROMPT = "Name three rivers."
TOKENS = 12
POLICY = "speculative"
MAX_QUEUE = 2
CLIENTS, ANSWERS = 4, 200            # the load test: 4 concurrent clients until 200 one-token answers
RSS_PER_ANSWER_KIB = 16              # allowed growth past warm-up per answer (allocator noise measured 0-0.2 MiB in
                                     # all): 3.1 MiB over the load, where a leak of 64 KiB an answer grows 12.5 MiB
KEY = secrets.token_hex(16)


class Served:
    """A running `bitnest serve`: its process, address, stderr lines so far, API key and the /health statuses seen
    while it loaded."""

    def __init__(self, proc: subprocess.Popen, url: str, log: list, key, loading: list):
        self.proc, self.url, self.log, self.key, self.loading = proc, url, log, key, loading
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def client(self, **kw) -> "openai.OpenAI":
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key or "none", max_retries=0, timeout=300,
                             **kw)

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", headers={**self.headers, **kw.pop("headers", {})}, timeout=60, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", headers={**self.headers, **kw.pop("headers", {})}, timeout=300, **kw)

    def stop(self) -> None:
        """SIGTERM: a graceful stop, exit 0, no traceback on stderr."""
        self.proc.terminate()
        assert self.proc.wait(60) == 0 and "stopped (SIGTERM)" in "".join(self.log), "".join(self.log)[-3000:]
        assert "Traceback" not in "".join(self.log), "".join(self.log)[-3000:]

    def rss_mib(self) -> float:
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def metrics(self) -> dict:
        """{sample line's name and labels: value} of GET /metrics."""
        text = self.get("/metrics").text
        return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))}


def start_server(checkpoint, *options, key=None) -> Served:
    """`scripts/serve.py` on a free port (--port 0: the line on stderr names it, at once), its key from
    $BITNEST_API_KEY; returns once /health answers 200, with the statuses it answered before."""
    env = {**os.environ, "BITNEST_API_KEY": key} if key else {k: v for k, v in os.environ.items()
                                                             if k != "BITNEST_API_KEY"}
    proc = subprocess.Popen([sys.executable, "scripts/serve.py", "--checkpoint", str(checkpoint), "--port", "0",
                             "--meter", "none", *map(str, options)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    log, url = [], []
    listening = threading.Event()

    def drain():                     # the whole stderr, so a full pipe never blocks the server
        for line in proc.stderr:
            log.append(line)
            if " on http://" in line and not url:
                url.append(line.split(" on ")[1].split()[0])
                listening.set()
        listening.set()

    threading.Thread(target=drain, daemon=True).start()
    listening.wait(300)
    assert url, f"the server did not start: {''.join(log)[-3000:]}"
    loading, deadline = [], time.time() + 300
    while time.time() < deadline:
        try:
            loading.append(httpx.get(f"{url[0]}/health", timeout=60).status_code)
        except httpx.ConnectError:           # it exited
            break
        if loading[-1] == 200:
            break
        time.sleep(0.05)
    if not loading or loading[-1] != 200:
        proc.kill()
        raise AssertionError(f"the model did not load: {loading[-5:]} {''.join(log)[-3000:]}")
    return Served(proc, url[0], log, key, loading[:-1])


@pytest.fixture(scope="module")
def server(rtn_checkpoint):
    s = start_server(rtn_checkpoint, "--policy", POLICY, "--max-queue", MAX_QUEUE, key=KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def chat(rtn_checkpoint):
    """`bitnest chat`'s greedy answer to PROMPT (same policy, same backend)."""
    r = subprocess.run([sys.executable, "scripts/chat.py", "--checkpoint", str(rtn_checkpoint), "--prompt", PROMPT,
                        "--max-new-tokens", str(TOKENS), "--policy", POLICY, "--meter", "none", "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def _check_usage(usage, chat: dict) -> None:
    """usage of a greedy answer to PROMPT against the chat's stats of the same answer."""
    s, b = chat["stats"], usage["bitnest"] if isinstance(usage, dict) else usage.model_extra["bitnest"]
    u = usage if isinstance(usage, dict) else usage.model_dump()
    assert u["completion_tokens"] == len(chat["tokens"]) and u["prompt_tokens"] == s["prefill_tokens"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert b["policy"] == s["policy"] == POLICY and b["backend"] == s["backend"]
    assert b["decode_tokens"] == s["tokens"] == len(chat["tokens"]) - 1
    assert 0 <= b["accepted_tokens"] <= b["drafted_tokens"] and b["drafted_tokens"] > 0
    assert b["acceptance"] == round(b["accepted_tokens"] / b["drafted_tokens"], 4) == s["acceptance"]
    for key in ("tokens_per_round", "draft_passes", "target_passes", "weight_bytes_per_token", "kv_bytes_per_token"):
        assert b[key] == s[key], key
    assert b["decode_tok_s"] > 0 and b["meter"] == "none"
    assert b["joules"] is None and b["joules_per_token"] is None and b["energy_reason"]


def test_greedy_answers_whole_and_streamed_equal_the_chats(server, chat):
    client = server.client()
    ask = dict(model="bitnest", messages=[{"role": "user", "content": PROMPT}], max_tokens=TOKENS, temperature=0,
               extra_body={"return_token_ids": True})
    r = client.chat.completions.create(**ask)
    c = r.choices[0]
    assert c.message.content == chat["text"] and c.model_extra["token_ids"] == chat["tokens"]
    assert c.finish_reason == ("stop" if len(chat["tokens"]) < TOKENS else "length")
    _check_usage(r.usage, chat)
    _check_timings(r.model_extra["timings"], r.usage.model_dump())

    deltas, finish, ids, usage, timings = [], None, None, None, None
    for chunk in client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            assert chunk.choices == [] and usage is None
            usage = chunk.usage
            continue
        assert usage is None, "a chunk after the usage chunk"
        d = chunk.choices[0]
        if d.delta.content:
            deltas.append(d.delta.content)
        if d.finish_reason is not None:
            finish, ids, timings = d.finish_reason, d.model_extra["token_ids"], chunk.model_extra["timings"]
    assert "".join(deltas) == chat["text"] and ids == chat["tokens"] and finish == c.finish_reason
    assert len(deltas) >= 2, f"the answer came in one piece: {deltas}"
    _check_usage(usage, chat)
    _check_timings(timings, usage.model_dump())


def _check_timings(t: dict, u: dict) -> None:
    """llama-server's `timings` of an answer against its usage."""
    b = u["bitnest"]
    assert t["prompt_n"] == u["prompt_tokens"] and t["predicted_n"] == u["completion_tokens"]
    assert t["draft_n"] == b["drafted_tokens"] and t["draft_n_accepted"] == b["accepted_tokens"]
    assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0 and t["queue_ms"] >= 0 and not b["time_limited"]
    # the server rounds the rate from its unrounded milliseconds, `predicted_ms` to 3 places: equal within rounding
    assert t["predicted_per_second"] == pytest.approx(t["predicted_n"] / t["predicted_ms"] * 1e3, abs=0.006)


def test_text_completions_models_health_and_metrics(server, rtn_checkpoint):
    client = server.client()
    whole = client.completions.create(model="bitnest", prompt="To be, or not to be,", max_tokens=6, temperature=0)
    assert whole.object == "text_completion" and whole.usage.completion_tokens >= 1
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=300, headers=server.headers,
                      json={"prompt": "To be, or not to be,", "max_tokens": 6, "temperature": 0, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == whole.choices[0].text
    assert chunks[-1]["choices"][0]["finish_reason"] == whole.choices[0].finish_reason
    models = client.models.list().data
    assert [m.id for m in models] == [Path(rtn_checkpoint).name] and models[0].object == "model"
    health = httpx.get(f"{server.url}/health", timeout=60).json()          # no key needed
    assert health["status"] == "ok" and health["policy"] == POLICY and health["context"] == 2048
    m = server.metrics()
    assert m['bitnest_requests_total{route="/v1/completions",status="200"}'] >= 2
    assert m["bitnest_completion_tokens_total"] >= 2 * whole.usage.completion_tokens
    assert m["bitnest_spec_decode_num_accepted_tokens_total"] <= m["bitnest_spec_decode_num_draft_tokens_total"]
    assert m["bitnest_queue_length"] == 0 and m["bitnest_decode_tokens_per_second"] > 0


def test_a_stop_string_of_many_tokens_ends_the_generation(server, rtn_checkpoint):
    """A stop string spanning 30 tokens (the runtime's own check reads the last 16) ends the generation, whole and
    streamed, as a token-by-token decode would: its text cut before the stop string, its tokens (usage, token_ids)
    through the one that completes it, none that a round drew past it."""
    from edge.model.tokenizer import load_tokenizer
    decode = load_tokenizer(rtn_checkpoint).decode
    ask = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 60, "temperature": 0}
    full = server.post("/v1/completions", json={**ask, "return_token_ids": True}).json()["choices"][0]
    ids, text = full["token_ids"], full["text"]
    assert len(ids) == 60, full
    start, end = len(decode(ids[:5])), len(decode(ids[:35]))
    stop = text[start:end]
    through = next(k for k in range(len(ids) + 1) if stop in decode(ids[:k]))       # the token that completes it
    whole = server.post("/v1/completions", json={**ask, "stop": [stop], "return_token_ids": True}).json()
    assert whole["choices"][0]["text"] == text[:start] and whole["choices"][0]["finish_reason"] == "stop", whole
    assert whole["choices"][0]["token_ids"] == ids[:through] and whole["usage"]["completion_tokens"] == through
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=300, headers=server.headers,
                      json={**ask, "stop": [stop], "stream": True, "stream_options": {"include_usage": True}}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == text[:start]
    assert chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def _error(r: httpx.Response, status: int, param=None) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["type"], err
    if param is not None:
        assert err["param"] == param, err


def test_bad_input_is_a_4xx_in_openais_shape_and_the_server_serves_on(server):
    url = f"{server.url}/v1/chat/completions"
    hi = [{"role": "user", "content": "Hi."}]
    post = lambda body, **kw: httpx.post(url, timeout=300, headers={**server.headers, "Content-Type": "application/json"},
                                         **({"content": body} if isinstance(body, str) else {"json": body}), **kw)
    _error(post('{"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4'), 400)   # malformed JSON
    _error(post("[1, 2]"), 400)
    _error(post({"messages": hi, "max_tokens": "4"}), 400, "max_tokens")
    _error(post({"messages": hi, "temperature": "hot"}), 400, "temperature")
    _error(post({"messages": hi, "stream": "yes"}), 400, "stream")
    _error(post({"messages": [{"role": "user", "content": 7}]}), 400, "messages[0].content")
    _error(post({"messages": []}), 400, "messages")
    _error(post({"messages": hi, "max_tokens": -1}), 400, "max_tokens")
    _error(post({"messages": hi, "max_tokens": -1, "stream": True}), 400, "max_tokens")
    long = [{"role": "user", "content": "word " * 3000}]
    _error(post({"messages": long, "max_tokens": 4}), 400, "messages")
    _error(post({"messages": hi, "max_tokens": 2047}), 400, "messages")              # prompt + max_tokens > 2048
    _error(server.post("/v1/completions", json={"prompt": 3}), 400, "prompt")
    _error(server.get("/v1/nothing"), 404)
    _error(server.get("/v1/chat/completions"), 405)
    client = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="bitnest", messages=[], max_tokens=4)
    assert e.value.status_code == 400 and e.value.body["param"] == "messages"
    r = client.chat.completions.create(model="bitnest", messages=hi, max_tokens=4, temperature=0)
    assert r.choices[0].message.content and r.usage.completion_tokens <= 4
    assert server.metrics()['bitnest_requests_total{route="/v1/chat/completions",status="400"}'] >= 10
    assert server.proc.poll() is None


def _cancelled_after(server, before: float, tokens_before: float) -> None:
    """Wait until the server counts one more cancelled generation, which wrote far fewer than its 1500 tokens."""
    deadline = time.time() + 120
    while time.time() < deadline:
        m = server.metrics()
        if m.get('bitnest_generations_total{finish_reason="cancelled"}', 0) > before:
            break
        time.sleep(0.2)
    assert m.get('bitnest_generations_total{finish_reason="cancelled"}', 0) == before + 1, m
    assert m["bitnest_completion_tokens_total"] - tokens_before < 1500


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_client_that_leaves_ends_its_generation(server, stream):
    m = server.metrics()
    before, tokens_before = m.get('bitnest_generations_total{finish_reason="cancelled"}', 0), \
        m["bitnest_completion_tokens_total"]
    body = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 1500, "temperature": 0, "stream": stream}
    if stream:
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=300, headers=server.headers) as r:
            for line in r.iter_lines():
                if '"text": "' in line and '"text": ""' not in line:
                    break                               # the first words: leave
    else:
        with pytest.raises(httpx.ReadTimeout):          # leave while it generates
            httpx.post(f"{server.url}/v1/completions", json=body, timeout=httpx.Timeout(300, read=1.0),
                       headers=server.headers)
    _cancelled_after(server, before, tokens_before)
    r = server.client().completions.create(model="bitnest", prompt="Hello", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens >= 1


def test_a_bounded_load_is_answered_or_refused_with_429_and_rss_stays_flat(server):
    """4 clients ask until 200 one-token answers are in (a refused request waits and asks again): every refusal is a
    429 with Retry-After, nothing else fails, and the server's RSS grows by less than 16 KiB an answer past warm-up
    (a leak of 64 KiB an answer, or one logits row, fails it)."""
    client = server.client()
    ask = lambda c: c.chat.completions.create(model="bitnest", messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=1, temperature=0)
    for _ in range(16):                                 # warm-up: allocator pools, the tokenizer's caches
        ask(client)
    rss0 = server.rss_mib()
    outcomes = []

    def one_client(_):
        c, answered = server.client(), 0
        while answered < ANSWERS // CLIENTS:
            try:
                r = ask(c)
                outcomes.append(200 if r.usage.completion_tokens == 1 else "not one token")
                answered += 1
            except openai.RateLimitError as e:
                assert e.response.headers.get("retry-after") == "1"
                assert e.body["code"] == "queue_full"
                outcomes.append(429)
                time.sleep(0.05)                        # a polite client waits a little (Retry-After says 1 s)
            except openai.APIStatusError as e:
                outcomes.append(e.status_code)
                return

    t0 = time.time()
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(one_client, range(CLIENTS)))
    seconds = time.time() - t0
    rss1 = server.rss_mib()
    answered, refused = outcomes.count(200), outcomes.count(429)
    print(f"\nload: {CLIENTS} clients, {answered} one-token answers and {refused} refusals with 429 in {seconds:.1f} s, "
          f"others {[o for o in outcomes if o not in (200, 429)]}; server RSS {rss0:.1f} MiB after warm-up, "
          f"{rss1:.1f} MiB after the load")
    assert answered == ANSWERS and answered + refused == len(outcomes), outcomes
    assert refused >= 1
    assert rss1 - rss0 < answered * RSS_PER_ANSWER_KIB / 1024, (rss0, rss1, answered)
    assert ask(client).usage.completion_tokens == 1


def test_held_text_never_streams_a_stop_string_or_a_broken_character():
    from edge.text_stream import HeldText
    sent = []
    h = HeldText(("STOP", "\n\n"), sent.append)
    for d in ("Hello S", "T", "ill here.", "\n", "More", " ST", "OP and after"):
        h.feed(d)
    h.finish("Hello STill here.\nMore ")
    assert "".join(sent) == "Hello STill here.\nMore " and sent[0] == "Hello "      # "S" waited for "T"
    sent.clear()
    h = HeldText((), sent.append)
    h.feed("caf\ufffd")                                # a partial character at the end decodes as U+FFFD ...
    assert sent == ["caf"]
    h.finish("café!")                                  # ... until its bytes come
    assert "".join(sent) == "café!" and "\ufffd" not in "".join(sent)
    sent.clear()
    h = HeldText((), sent.append)
    for d in ("a stray \ufffd", " byte", " and more"):      # the model's own U+FFFD mid-text holds nothing back
        h.feed(d)
    assert sent == ["a stray ", "\ufffd byte", " and more"]


def test_the_python_api_answers_and_streams_as_the_chat(rtn_checkpoint, chat):
    from edge import LLM
    with LLM(rtn_checkpoint, policy=POLICY, meter="none") as llm:
        a = llm.chat(PROMPT, max_tokens=TOKENS, temperature=0)
        assert (a.text, a.tokens) == (chat["text"], chat["tokens"])
        assert a.prompt_tokens == chat["stats"]["prefill_tokens"]
        assert a.summary()["acceptance"] == chat["stats"]["acceptance"] and a.summary()["energy_reason"]
        with llm.stream([{"role": "user", "content": PROMPT}], max_tokens=TOKENS, temperature=0) as s:
            assert "".join(s) == chat["text"] and s.answer.tokens == chat["tokens"]
        word = chat["text"].split()[len(chat["text"].split()) // 2]            # a stop string from its own output
        with llm.stream(PROMPT, max_tokens=TOKENS, temperature=0, stop=[word]) as s:
            text = "".join(s)
        assert text == s.answer.text == chat["text"][:chat["text"].index(word)] and s.answer.finish_reason == "stop"
        n = len(s.answer.tokens)            # through the token that completes the stop string, none past it
        assert s.answer.tokens == chat["tokens"][:n] and word in llm.tokenizer.decode(chat["tokens"][:n]) and \
            word not in llm.tokenizer.decode(chat["tokens"][:n - 1])
        with llm.stream(PROMPT, max_tokens=200, temperature=0) as s:
            next(s)
        assert s.answer.finish_reason == "cancelled" and len(s.answer.tokens) < 200


def test_a_queued_stream_gets_sse_comments_until_its_first_token(rtn_checkpoint):
    """A stream queued behind a generation (`--sse-ping 0.1`: a comment after 0.1 s without a byte) receives `: ping`
    lines while it waits, then its events; the openai client's stream, queued the same way, skips them and its text
    is the whole answer's. A stream that keeps flowing (the module's server, 15 s) carries none (test above)."""
    s = start_server(rtn_checkpoint, "--policy", "target", "--max-queue", 1, "--sse-ping", 0.1)
    busy = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 80, "temperature": 0, "stream": True}
    ask = {"model": "bitnest", "prompt": "To be, or not to be,", "max_tokens": 6, "temperature": 0}

    def behind_a_generation(queued):
        """Run `queued()` once a long stream has sent its first token (so it waits its whole generation)."""
        started = threading.Event()

        def hold():
            with httpx.stream("POST", f"{s.url}/v1/completions", json=busy, timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        started.set()
            started.set()

        t = threading.Thread(target=hold, daemon=True)
        t.start()
        assert started.wait(300)
        try:
            return queued()
        finally:
            t.join(300)

    def raw():
        with httpx.stream("POST", f"{s.url}/v1/completions", json={**ask, "stream": True}, timeout=300) as r:
            return [line for line in r.iter_lines() if line]

    try:
        lines = behind_a_generation(raw)
        first = next(i for i, line in enumerate(lines) if line.startswith("data: "))
        assert first >= 2 and set(lines[:first]) == {": ping"}, lines[:first + 1]
        assert lines[-1] == "data: [DONE]" and all(x.startswith("data: ") or x == ": ping" for x in lines)
        text = "".join(json.loads(x[6:])["choices"][0]["text"] for x in lines if x.startswith("data: {"))
        client = s.client()
        streamed = behind_a_generation(lambda: list(client.completions.create(**ask, stream=True)))
        whole = client.completions.create(**ask)
        assert "".join(c.choices[0].text for c in streamed) == text == whole.choices[0].text and text
    finally:
        s.stop()
