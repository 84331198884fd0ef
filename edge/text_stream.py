"""Streaming detokenization: the text deltas of an answer whose tokens arrive a few at a time, each token decoded
a bounded number of times (decoding the whole answer again at every new token is quadratic in its length); and
stop strings, the one place an answer is cut at one (held back from a stream: HeldText; its tokens and text:
cut_at_stop)."""

from bisect import bisect_left
from typing import Callable, Optional

REPLACEMENT = "\ufffd"      # what a decoder writes for an incomplete UTF-8 sequence at the end of its bytes


class TextStream:
    """Feed token ids with `push` (it returns the new text that is final), then `finish` (the rest).

    The window (as text-generation-inference and vLLM stream): `tokens[prefix:read]` is the last piece already
    shown, `tokens[prefix:]` that piece and everything after it. Decoding both, the second's text past the first's
    is new; it is emitted once it does not end in U+FFFD (a character whose bytes have not all arrived: byte-level
    tokens may split one), and then the window moves on (prefix = read, read = end). A window starts at a
    character boundary, so the pieces, concatenated, are `decode(all tokens)` for a byte-level decoder; the one
    decoded piece before the window gives the decoder the context of a leading space."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.tokens: list[int] = []
        self.prefix = self.read = 0

    def push(self, ids: list[int]) -> str:
        self.tokens.extend(ids)
        return self._delta(final=False)

    def finish(self) -> str:
        """What was held back (an incomplete character at the very end is written as the decoder writes it)."""
        return self._delta(final=True)

    def _delta(self, final: bool) -> str:
        if self.read == len(self.tokens):
            return ""
        shown = self.decode(self.tokens[self.prefix:self.read])
        text = self.decode(self.tokens[self.prefix:])
        if not final and (len(text) <= len(shown) or text.endswith(REPLACEMENT)):
            return ""
        self.prefix, self.read = self.read, len(self.tokens)
        return text[len(shown):]


class HeldText:
    """The text deltas a stream may send: a tail that could begin a stop string, or an unfinished character at the
    end (U+FFFD from a partial byte sequence), waits for the next tokens; a U+FFFD with text after it is the model's
    own and goes out; a stop string and what follows never go out. `finish(text)` sends what the final text holds
    beyond what was sent."""

    def __init__(self, stops: tuple[str, ...], emit: Callable[[str], None]):
        self.stops, self.emit = tuple(s for s in stops if s), emit
        self.text, self.sent, self.stopped = "", 0, False

    def feed(self, delta: str) -> None:
        if self.stopped:
            return
        self.text += delta
        cut = len(self.text)
        hit = first_stop(self.text, self.stops)
        if hit is not None:
            cut, self.stopped = hit, True
        else:
            for s in self.stops:     # the longest tail that is a proper prefix of a stop string
                k = next((k for k in range(min(len(s) - 1, cut), 0, -1) if self.text.endswith(s[:k])), 0)
                cut = min(cut, len(self.text) - k)
            cut = min(cut, len(self.text.rstrip("\ufffd")))     # an unfinished character at the very end
        self._send(cut)

    def finish(self, final: str) -> None:
        if final.startswith(self.text[:self.sent]):
            self.text, self.stopped = final, True
            self._send(len(final))

    def _send(self, cut: int) -> None:
        if cut > self.sent:
            self.emit(self.text[self.sent:cut])
            self.sent = cut


def first_stop(text: str, stops: tuple[str, ...]) -> Optional[int]:
    """Where the earliest stop string in `text` begins (None where it holds none; empty stops never match)."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


def cut_at_stop(tokens: list[int], decode: Callable[[list[int]], str],
                stops: tuple[str, ...]) -> tuple[list[int], str, bool]:
    """(tokens, text, stopped) of an answer as a token-by-token decode ends it at a stop string: the shortest
    prefix of `tokens` whose text holds one (the token that completes it kept, those a speculative round or the
    next round's check drew past it dropped) and that prefix's text up to its earliest stop string; where no stop
    string occurs, (tokens, decode(tokens), False). Binary search over the prefixes (a prefix's text is a prefix
    of a longer one's), so O(log n) decodes."""
    text = decode(tokens)
    if first_stop(text, stops) is None:
        return tokens, text, False
    n = bisect_left(range(len(tokens) + 1), True, key=lambda k: first_stop(decode(tokens[:k]), stops) is not None)
    text = decode(tokens[:n])
    return tokens[:n], text[:first_stop(text, stops)], True
