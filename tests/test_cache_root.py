"""The cache folder's rule, the same in the runtime and in the native build: `$BITNEST_CACHE`, and an empty one counts
as unset (it would put exports, the native library and cost tables in whatever folder a command runs from)."""

from pathlib import Path

from edge.analysis.bench.common import cache_folder
from edge.cache import cache_root
from plugins.native import build_folder


def test_an_empty_cache_variable_is_the_default_folder(monkeypatch, tmp_path):
    default = Path.home() / ".cache" / "bitnest-edge"
    for value in ("", None):
        if value is None:
            monkeypatch.delenv("BITNEST_CACHE", raising=False)
        else:
            monkeypatch.setenv("BITNEST_CACHE", value)
        assert cache_root() == cache_folder() == default
        assert build_folder().parent.parent == default
    monkeypatch.setenv("BITNEST_CACHE", str(tmp_path))
    assert cache_root() == cache_folder() == tmp_path and build_folder().parent.parent == tmp_path
