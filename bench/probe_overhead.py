"""What mode auto's speculative rounds cost, read off an `ssd bench` JSON without trusting its tok/s ratios.

    python -m bench.probe_overhead bench/results/run8_b16.json [more.json ...]

For each auto run (sd-auto, ssd-auto): the rounds it speculated, and their excess, the time they took (their
measured verify + propose ms) beyond what their tokens take at the mean AR speed of the same process, as a share of
the run's decode time. On a machine whose run-to-run noise is larger than the difference to measure, this share
still says what the chooser's probes cost.
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path


def probe_overhead(run: dict, ar_tok_s: float) -> tuple[int, float]:
    """(speculative rounds, their excess seconds) of one auto run against `ar_tok_s`."""
    chosen = run["adaptive_rounds"]
    rounds = chosen.get("speculate", 0) + chosen.get("sd", 0)
    if not rounds:
        return 0, 0.0
    round_s = (run["verify_ms_per_round"] + run["propose_ms_per_round"]) / 1e3
    tokens = run["tokens_per_round"] * rounds * run["batch"]
    return rounds, rounds * round_s - tokens / ar_tok_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="ssd bench --json files with ar and auto runs")
    for path in p.parse_args().results:
        runs = json.loads(Path(path).read_text())["runs"]
        ar: dict[str, list[float]] = defaultdict(list)
        for run in runs:
            if run["mode"] == "ar":
                ar[run["dataset"]].append(run["decode_tok_s"])
        print(path)
        for run in runs:
            if not run["mode"].endswith("-auto") or not ar[run["dataset"]]:
                continue
            ar_tok_s = sum(ar[run["dataset"]]) / len(ar[run["dataset"]])
            rounds, excess = probe_overhead(run, ar_tok_s)
            decode_s = run["output_tokens"] / run["decode_tok_s"]
            steps = sum(run["adaptive_rounds"].values())
            print(f"  {run['mode']:9s} batch {run['batch']:2d} {run['dataset']:9s} speculative rounds {rounds:4d} of "
                  f"{steps:5d}, excess {excess:5.2f} s = {100 * excess / decode_s:4.1f}% of {decode_s:.2f} s decode")


if __name__ == "__main__":
    main()
