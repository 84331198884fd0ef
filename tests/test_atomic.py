"""Atomic writes (edge.atomic): a file or a folder appears whole or not at all; a failed write leaves nothing beside
its target, a folder left half-written is replaced, and one another process finished first is kept."""

import os

import pytest

from edge.atomic import staged_folder, write_atomic


def whole(folder):
    return (folder / "config.json").is_file()


def test_a_file_is_replaced_whole(tmp_path):
    out = tmp_path / "a.json"
    write_atomic(b"old", out)
    write_atomic(b"new", out)
    assert out.read_bytes() == b"new" and os.listdir(tmp_path) == ["a.json"]


def test_a_folder_appears_whole_or_not_at_all(tmp_path):
    dest = tmp_path / "model"
    with pytest.raises(RuntimeError):
        with staged_folder(dest, whole) as tmp:
            (tmp / "config.json").write_text("{}")
            raise RuntimeError("the conversion failed half-way")
    assert os.listdir(tmp_path) == []                         # no dest, no staging folder left
    with staged_folder(dest, whole) as tmp:
        assert tmp.parent == tmp_path and tmp != dest and not dest.exists()
        (tmp / "config.json").write_text("{}")
        (tmp / "weights").write_text("w")
    assert sorted(os.listdir(dest)) == ["config.json", "weights"] and os.listdir(tmp_path) == ["model"]


def test_a_half_written_folder_is_replaced_and_a_whole_one_written_first_is_kept(tmp_path):
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "weights").write_text("partial")                  # no config.json: left half-written by hand
    with staged_folder(dest, whole) as tmp:
        (tmp / "config.json").write_text("{}")
    assert os.listdir(dest) == ["config.json"]
    with staged_folder(dest, whole) as tmp:                   # another process finished first: its folder stays
        (tmp / "config.json").write_text('{"mine": 1}')
    assert (dest / "config.json").read_text() == "{}" and os.listdir(tmp_path) == ["model"]
