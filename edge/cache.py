"""Where the runtime keeps its per-user files: `$BITNEST_CACHE`, else ~/.cache/bitnest-edge (the folder the
exports, the native library and the auto policy's pass-cost tables share). An empty `BITNEST_CACHE` (as
`export BITNEST_CACHE=` leaves it) counts as unset: it would otherwise put the cache in whatever folder the
command runs from."""

import os
from pathlib import Path

CACHE_ENV = "BITNEST_CACHE"


def cache_root() -> Path:
    """The user's BitNest cache folder (not created here)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "bitnest-edge")
