"""OpenAI's wire format for `bitnest serve`: request bodies checked field by field into typed requests (a bad field
is an APIError naming it, never a crash; a known field this server cannot honour is refused, never dropped), the error
body `{"error": {message, type, param, code}}`, and the completion, chunk and usage objects, usage carrying a
`bitnest` block (speculation, bytes, speed, energy) and each answer llama-server's `timings`."""

import json
import math
import secrets
from dataclasses import dataclass
from typing import Any, Optional

from edge.llm import Answer

CHAT, COMPLETION = "chat", "completion"
ROLES = ("system", "developer", "user", "assistant")    # developer: OpenAI's newer name for system
MAX_STOPS = 4                                            # as OpenAI's API
SEED_RANGE = 2 ** 63
# Known fields (OpenAI's, llama-server's and vLLM's) this server cannot honour: refused with 400 unless they hold one
# of the values that ask for nothing (absent or null always passes). `top_k` is honoured (a field of the Request).
NOT_HONOURED = {
    "n": (1,), "best_of": (1,), "echo": (False,), "tools": ([],), "functions": ([],), "function_call": ("none",),
    "logit_bias": ({},), "top_logprobs": (0,), "suffix": ("",), "prediction": (), "audio": (),
    "modalities": (["text"],), "frequency_penalty": (0,), "presence_penalty": (0,), "repetition_penalty": (1,),
    "repeat_penalty": (1,), "min_p": (0,), "typical_p": (1,), "min_tokens": (0,), "ignore_eos": (False,),
    "stop_token_ids": ([],), "continue_final_message": (False,), "logprobs": (False, 0),
    # vLLM's template switches (the template always ends with the assistant's turn opened, and takes no arguments);
    # tool choices and a service tier other than what no tools and no tiers mean
    "add_generation_prompt": (True,), "chat_template_kwargs": ({},), "tool_choice": ("none", "auto"),
    "parallel_tool_calls": (True, False), "service_tier": ("auto", "default"),
}


class APIError(Exception):
    """An error answered in OpenAI's shape with an HTTP status (4xx: the request's fault)."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 type: str = "invalid_request_error", close: bool = False):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.close = close          # the connection closes after the answer (a body left unread)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param, code)


@dataclass(frozen=True)
class Request:
    """One chat or text completion request, checked. `max_tokens` None: as many as the context leaves; `seed`
    None: a fresh one per request (OpenAI's sampling is not reproducible without one)."""

    kind: str
    messages: Optional[list]
    prompt: Optional[str]
    max_tokens: Optional[int]
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: tuple
    stream: bool
    include_usage: bool
    return_token_ids: bool


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or a 400 saying what is wrong with it (nesting past Python's recursion limit
    included)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the body is not valid JSON ({e})", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "the body's JSON is nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    return body


def _field(body: dict, name: str, kinds, what: str, default=None):
    """body[name] where present and not null, checked against `kinds` (bool is never a number here)."""
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
        raise invalid(name, f"'{name}' must be {what}, got {type(v).__name__}: {json.dumps(v)[:60]}",
                      "invalid_type")
    return v


def _number(body: dict, name: str, lo: float, hi: float, default: float, lo_open: bool = False) -> float:
    v = _field(body, name, (int, float), "a number", default)
    if not math.isfinite(v) or v < lo or v > hi or lo_open and v == lo:
        raise invalid(name, f"'{name}' must be in {'(' if lo_open else '['}{lo}, {hi}], got {v}")
    return float(v)


def _not_supported(body: dict, name: str, allowed) -> None:
    v = body.get(name)
    if v is not None and v not in allowed:
        raise invalid(name, f"'{name}' = {json.dumps(v)[:60]} is not supported by this server", "unsupported")


def _text(s: str, param: str) -> str:
    """`s`, refused where it cannot be written as UTF-8 (a lone surrogate escape such as \\ud800)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise invalid(param, f"{param} holds a lone surrogate ({s[e.start]!a} at character {e.start}): not text "
                             "UTF-8 can carry") from None
    return s


def _content(m: dict, i: int) -> str:
    """A message's text: a string, or a list of text parts (no images or audio here), one line each (as vLLM joins
    them: ["Hello", "world"] is not "Helloworld")."""
    c, param = m.get("content"), f"messages[{i}].content"
    if isinstance(c, str):
        return _text(c, param)
    if c is None and m.get("role") == "assistant":
        return ""
    if isinstance(c, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                   for p in c):
        return _text("\n".join(p["text"] for p in c), param)
    raise invalid(param, f"{param} must be a string or a list of text parts", "invalid_type")


def _messages(body: dict) -> list:
    ms = body.get("messages")
    if not isinstance(ms, list):
        raise invalid("messages", "'messages' must be a list of {\"role\", \"content\"} objects",
                      "invalid_type" if ms is not None else "missing_required_parameter")
    if not ms:
        raise invalid("messages", "'messages' must hold at least one message", "empty_array")
    out = []
    for i, m in enumerate(ms):
        if not isinstance(m, dict):
            raise invalid(f"messages[{i}]", f"messages[{i}] must be an object", "invalid_type")
        if m.get("role") not in ROLES:
            raise invalid(f"messages[{i}].role", f"messages[{i}].role must be one of {', '.join(ROLES)}, got "
                          f"{json.dumps(m.get('role'))[:40]}")
        out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": _content(m, i)})
    return out


def _prompt(body: dict) -> str:
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1:
        p = p[0]
    if not isinstance(p, str):
        raise invalid("prompt", "'prompt' must be a string (one prompt per request)",
                      "invalid_type" if p is not None else "missing_required_parameter")
    if not p:
        raise invalid("prompt", "'prompt' must not be empty")
    return _text(p, "prompt")


def _common(body: dict, kind: str, messages, prompt) -> Request:
    _field(body, "model", (str,), "a string")
    limit = "max_completion_tokens" if kind == CHAT and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _field(body, limit, (int,), "an integer")
    if max_tokens is not None and max_tokens < 1:
        raise invalid(limit, f"'{limit}' must be at least 1, got {max_tokens}")
    seed = _field(body, "seed", (int,), "an integer")
    if seed is not None and not 0 <= seed < SEED_RANGE:
        raise invalid("seed", f"'seed' must be in [0, 2^63), got {seed}")
    stop = _field(body, "stop", (str, list), "a string or a list of strings", ())
    stop = (stop,) if isinstance(stop, str) else stop
    if len(stop) > MAX_STOPS or not all(isinstance(s, str) and s for s in stop):
        raise invalid("stop", f"'stop' must be a non-empty string or a list of at most {MAX_STOPS} of them")
    stop = [_text(s, "stop") for s in stop]
    stream = _field(body, "stream", (bool,), "true or false", False)
    options = _field(body, "stream_options", (dict,), "an object", {})
    if options and not stream:
        raise invalid("stream_options", "'stream_options' is only allowed with 'stream': true")
    include_usage = _field(options, "include_usage", (bool,), "true or false", False)
    _field(body, "n", (int,), "an integer")
    for name in ("frequency_penalty", "presence_penalty"):
        _number(body, name, -2.0, 2.0, 0.0)
    for name, allowed in NOT_HONOURED.items():
        _not_supported(body, name, allowed)
    if body.get("response_format") not in (None, {"type": "text"}):
        raise invalid("response_format", "only the text response format is supported", "unsupported")
    top_k = _field(body, "top_k", (int,), "an integer", 0)
    if top_k < -1:
        raise invalid("top_k", f"'top_k' must be at least 1, or 0 or -1 for every token, got {top_k}")
    return Request(kind, messages, prompt, max_tokens, _number(body, "temperature", 0.0, 2.0, 1.0),
                   _number(body, "top_p", 0.0, 1.0, 1.0, lo_open=True), max(top_k, 0),
                   secrets.randbelow(SEED_RANGE) if seed is None else seed, tuple(stop), stream, include_usage,
                   _field(body, "return_token_ids", (bool,), "true or false", False))


def chat_request(body: dict) -> Request:
    """POST /v1/chat/completions."""
    return _common(body, CHAT, _messages(body), None)


def completion_request(body: dict) -> Request:
    """POST /v1/completions."""
    return _common(body, COMPLETION, None, _prompt(body))


# -- responses --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Served:
    """What the server adds to an answer: its wait for the engine (seconds), and whether the server's time limit
    (--time-limit) ended it (its finish reason is then `length`)."""

    queue_seconds: float = 0.0
    time_limited: bool = False


def bitnest_block(a: Answer, served: Served) -> dict:
    """What only this runtime reports: the policy and its speculation, bytes per token, decode speed and energy
    (joules and J/token of the decode phase where a meter runs, else null and `energy_reason`), the wait for the
    engine and whether the server's time limit ended the answer."""
    st, s = a.stats, a.summary()
    return {"policy": st.policy, "backend": st.backend, "drafted_tokens": st.drafted, "accepted_tokens": st.accepted,
            "accepted_per_position": list(st.accepted_per_pos), "acceptance": s["acceptance"], "rounds": st.rounds, "tokens_per_round": s["tokens_per_round"],
            "escalation_rate": s["escalation_rate"], "draft_passes": st.draft_passes,
            "target_passes": st.target_passes, "weight_bytes_per_token": s["weight_bytes_per_token"],
            "kv_bytes_per_token": s["kv_bytes_per_token"], "decode_tokens": st.tokens, "decode_tok_s": s["tok_s"],
            "prefill_tok_s": s["prefill_tok_s"], "meter": s.get("meter"), "joules": s.get("joules"),
            "joules_per_token": s.get("joules_per_token"), "energy_reason": s.get("energy_reason"),
            "queue_seconds": round(served.queue_seconds, 4), "time_limited": served.time_limited}


def usage(a: Answer, served: Served) -> dict:
    """OpenAI's usage (completion tokens: every new token, the one that ended the answer included) and ours."""
    return {"prompt_tokens": a.prompt_tokens, "completion_tokens": len(a.tokens),
            "total_tokens": a.prompt_tokens + len(a.tokens), "bitnest": bitnest_block(a, served)}


def timings(a: Answer, served: Served) -> dict:
    """llama-server's `timings`, counted as it counts them: the prompt's tokens and its prefill time; every new
    token (predicted_n = usage.completion_tokens, the prefill's own included) over the decode phase's time; the
    draft's proposals and the target's acceptances. `queue_ms` (ours) is the wait for the engine."""
    st = a.stats
    prompt_ms, predicted_ms = st.prefill_seconds * 1e3, st.decode_seconds * 1e3
    rate = lambda n, ms: (round(ms / n, 3) if n else None, round(n / ms * 1e3, 2) if ms > 0 else None)
    prompt_per_token, prompt_per_second = rate(a.prompt_tokens, prompt_ms)
    predicted_per_token, predicted_per_second = rate(len(a.tokens), predicted_ms)
    return {"prompt_n": a.prompt_tokens, "prompt_ms": round(prompt_ms, 3), "prompt_per_token_ms": prompt_per_token,
            "prompt_per_second": prompt_per_second, "predicted_n": len(a.tokens),
            "predicted_ms": round(predicted_ms, 3), "predicted_per_token_ms": predicted_per_token,
            "predicted_per_second": predicted_per_second, "draft_n": st.drafted, "draft_n_accepted": st.accepted,
            "queue_ms": round(served.queue_seconds * 1e3, 3)}


def _object(kind: str, chunk: bool) -> str:
    if kind == CHAT:
        return "chat.completion.chunk" if chunk else "chat.completion"
    return "text_completion"


def head(rid: str, created: int, model: str, kind: str, chunk: bool) -> dict:
    return {"id": rid, "object": _object(kind, chunk), "created": created, "model": model}


def choice(kind: str, text: Optional[str], finish: Optional[str], chunk: bool, token_ids=None) -> dict:
    """One choice: a chat message (a delta in a chunk) or a completion's text."""
    c: dict[str, Any] = {"index": 0}
    if kind == CHAT:
        if chunk:
            c["delta"] = {} if text is None else {"content": text}
        else:
            c["message"] = {"role": "assistant", "content": text}
        c["logprobs"] = None
    else:
        c["text"], c["logprobs"] = text or "", None
    c["finish_reason"] = finish
    if token_ids is not None:
        c["token_ids"] = token_ids
    return c


def response(rid: str, created: int, model: str, req: Request, a: Answer, served: Served) -> dict:
    """The whole answer of a request that did not stream, `timings` beside its usage."""
    ids = a.tokens if req.return_token_ids else None
    return {**head(rid, created, model, req.kind, False), "system_fingerprint": None,
            "choices": [choice(req.kind, a.text, a.finish_reason, False, ids)], "usage": usage(a, served),
            "timings": timings(a, served)}


def chunk(rid: str, created: int, model: str, req: Request, text: Optional[str], finish: Optional[str] = None,
          token_ids=None, role: bool = False, timed: Optional[dict] = None) -> dict:
    """One server-sent event's object; with include_usage every chunk carries `usage: null` but the last. The chunk
    with the finish reason carries the answer's `timings` (as llama-server's last chunk does)."""
    c = choice(req.kind, text, finish, True, token_ids if req.return_token_ids else None)
    if role:
        c["delta"] = {"role": "assistant", "content": ""}
    out = {**head(rid, created, model, req.kind, True), "system_fingerprint": None, "choices": [c]}
    if req.include_usage:
        out["usage"] = None
    if timed is not None:
        out["timings"] = timed
    return out


def usage_chunk(rid: str, created: int, model: str, req: Request, a: Answer, served: Served) -> dict:
    return {**head(rid, created, model, req.kind, True), "system_fingerprint": None, "choices": [],
            "usage": usage(a, served)}


def sse(obj) -> str:
    """One server-sent event."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


SSE_PING = ": ping\n\n"    # an SSE comment: clients skip it (the SSE spec; OpenAI's SDK), a proxy sees bytes flow
