"""The pass-cost table the `auto` policy reads: seconds per target pass of each width and per draft pass on one
engine (measured and cached by edge.engine.costs; held by the engine that it was measured on)."""

from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class CostTable:
    """Seconds per pass on one engine: `target[w - 1]` for a target pass of w tokens (w = 1..len(target)),
    `draft` for a one-token draft pass; where it came from ("cache" or "measured"), its file (None where it
    was not saved), `note`, one line where a cached table was refused or could not be saved, and `check`, a cached
    table's spot check on this engine (edge.engine.costs.check_table: its ratios cached and timed now)."""

    target: tuple[float, ...]
    draft: float
    source: str
    path: Optional[Path]
    context: int
    note: Optional[str] = None
    check: Optional[dict] = None

    def summary(self) -> dict:
        """The table as the stats report it: milliseconds per view and width."""
        ms = lambda s: round(s * 1e3, 3)
        return {"target_ms": {str(w): ms(t) for w, t in enumerate(self.target, 1)}, "draft_ms": {"1": ms(self.draft)},
                "source": self.source, "path": str(self.path) if self.path else None, "context": self.context,
                **({"note": self.note} if self.note else {}), **({"check": self.check} if self.check else {})}
