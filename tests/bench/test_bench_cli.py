"""`ssd bench`'s flags reach BenchSettings: every setting main() reads is a parsed flag (the SSD ones included)."""

import argparse

import pytest

from bench import cli


class _Captured(Exception):
    pass


def test_parsed_flags_build_the_settings(monkeypatch):
    def capture(base, *rest, **options):  # noqa: ANN001, ANN002, ANN003, ANN202 - stands in for run_benchmarks
        raise _Captured(base, options)

    monkeypatch.setattr(cli, "run_benchmarks", capture)
    p = argparse.ArgumentParser()
    cli.add_bench_arguments(p)
    args = p.parse_args(["--mode", "sd,ssd", "--numseqs", "1", "--backup", "neural", "--backup-hits",
                         "--fan-out", "uniform", "--saguaro-c", "0.5", "--interleave"])
    with pytest.raises(_Captured) as got:
        cli.main(args)
    base, options = got.value.args
    assert (base.backup, base.backup_hits, base.fan_out, base.saguaro_c) == ("neural", True, "uniform", 0.5)
    assert options == {"interleave": True}
