"""Request preparation for `bitnest serve`, off the event loop: a request body becomes the prompt's token ids and the
generation's settings on one thread of its own (the front's tokenizer is not thread-safe, so one request at a time
goes through it), while the loop goes on serving streams and `/health`. Its bounds come from the context: a body
larger than any prompt that fits could be is refused before it is parsed (guard.py), and a prompt of more messages
than positions, or whose text is longer than `capacity` of the vocabulary's longest token, before it is tokenized."""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional

from jinja2 import TemplateError

from edge.decode.config import GenerateConfig
from edge.errors import BitNestError
from edge.llm import LLM
from edge.model.tokenizer import encode
from edge.serve import protocol
from edge.serve.protocol import CHAT, APIError, Request

JSON_ESCAPE = 3          # bytes of JSON a byte of prompt text may take (ensure_ascii: "é" is 2 bytes, \u00e9 is 6)
JSON_ROOM = 64 << 10     # bytes for everything in a body but its prompt text (fields, roles, stop strings)


@dataclass(frozen=True)
class Prepared:
    """A request ready for the engine: its fields, the prompt's token ids and the generation's settings."""

    req: Request
    ids: list[int]
    cfg: GenerateConfig


def longest_token_bytes(tokenizer) -> int:
    """UTF-8 bytes of the vocabulary's longest token as decoded text (special tokens included)."""
    ids = [[i] for i in range(len(tokenizer))]
    backend = getattr(tokenizer, "backend_tokenizer", None)          # a fast tokenizer decodes the batch in Rust
    texts = backend.decode_batch(ids, skip_special_tokens=False) if backend is not None else \
        tokenizer.batch_decode(ids, skip_special_tokens=False)
    return max(len(t.encode("utf-8", "replace")) for t in texts)


def prompt_text(req: Request) -> str:
    return "".join(m["content"] for m in req.messages) if req.kind == CHAT else req.prompt


class Preparer:
    """`await prepare(raw, parse)` parses, checks and tokenizes one request body on the preparation thread;
    every refusal is an APIError (4xx). `max_tokens` caps every request's new tokens (None: the context's room)."""

    def __init__(self, llm: LLM, tokenizer, max_tokens: Optional[int] = None):
        self.llm, self.tokenizer, self.max_tokens = llm, tokenizer, max_tokens
        self.token_bytes = longest_token_bytes(tokenizer)
        self.max_text = llm.capacity * self.token_bytes          # characters: any longer text has > capacity tokens
        self.max_body = JSON_ESCAPE * self.max_text + JSON_ROOM
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bitnest-prepare")

    async def prepare(self, raw: bytes, parse: Callable[[dict], Request]) -> Prepared:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._prepare, raw, parse)

    def _prepare(self, raw: bytes, parse: Callable[[dict], Request]) -> Prepared:
        """Prompt ids and settings; a prompt that does not fit the context with its max_tokens is refused here,
        before any work on the engine (one whose text alone is too long, before it is tokenized)."""
        req = parse(protocol.parse_json(raw))
        param = "messages" if req.kind == CHAT else "prompt"
        if req.kind == CHAT and len(req.messages) > self.llm.capacity:
            raise APIError(400, f"{len(req.messages)} messages cannot fit a context of {self.llm.capacity} positions",
                           param, "context_length_exceeded")
        chars = len(prompt_text(req))
        if chars > self.max_text:
            raise APIError(400, f"the {param} has {chars} characters: more than the context of {self.llm.capacity} "
                                f"positions can hold ({self.token_bytes} characters per token at most)", param,
                           "context_length_exceeded")
        try:
            ids = encode(self.tokenizer, req.messages if req.kind == CHAT else req.prompt, chat=req.kind == CHAT)
        except TemplateError as e:          # the model's chat template refused the conversation
            raise APIError(400, f"the model's chat template refused these messages: {e}", "messages",
                           "invalid_messages") from None
        room = self.llm.capacity - len(ids)
        max_tokens = req.max_tokens if req.max_tokens is not None else max(1, room)
        if self.max_tokens is not None:
            max_tokens = min(max_tokens, self.max_tokens)
        try:
            self.llm.check_fits(len(ids), max_tokens)
            cfg = self.llm.settings(max_tokens, req.temperature, req.top_p, req.seed, req.top_k)
        except BitNestError as e:
            raise APIError(400, str(e), param, "context_length_exceeded") from None
        except ValueError as e:
            raise APIError(400, str(e), None, "invalid_value") from None
        return Prepared(req, ids, cfg)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
