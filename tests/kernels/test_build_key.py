"""The CPU kernels' build folder key: the same code in two checkouts builds in two folders."""

import shutil

from ssd_kernels.cpu import extension


def test_two_checkouts_of_the_same_sources_get_two_build_keys(tmp_path, monkeypatch):
    here = extension.build_key()
    assert extension.build_key() == here  # stable for one checkout
    copy = tmp_path / "cpu"
    shutil.copytree(extension._FOLDER, copy)
    monkeypatch.setattr(extension, "_FOLDER", copy)
    assert extension.build_key() != here
