"""Time the draft-training data stage: answer shards generated (and captured) for the default training prompts.

    python -m draft_training.bench_data --out /tmp/draft-data --shards 2

Writes the first `--shards` answer shards into an empty `--out` folder (a folder that already holds them is
reused, and then nothing is timed), and prints seconds per shard from the stage's own log plus the total with
model loading. Used for docs/benchmarks.md's data-stage entry; compare two commits by running it in each
checkout one after the other.
"""

import argparse
import json
import time
from pathlib import Path

import structlog
import torch

from draft_training.data_gen import DataConfig, generate_data
from ssd.log_setup import configure_logging
from ssd.model_store import resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="an empty folder for the shards")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--shard-size", type=int, default=64, help="prompts per shard (the generation batch)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="the target's")
    args = parser.parse_args()
    configure_logging()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        parser.error(f"{out} is not empty; timing needs a fresh folder")
    config = DataConfig(target=str(resolve_model(args.model)), num_threads=args.threads, max_shards=args.shards,
                        shard_size=args.shard_size, dtype=args.dtype)
    shard_seconds: list[float] = []

    def keep_seconds(_logger, _name, event):  # type: ignore[no-untyped-def]
        if event.get("event") == "shard written":
            shard_seconds.append(event["seconds"])
        return event

    structlog.configure(processors=[keep_seconds, *structlog.get_config()["processors"]])
    started = time.perf_counter()
    generate_data(config, out)
    print(json.dumps({"shards": args.shards, "shard_size": args.shard_size, "shard_seconds": shard_seconds,
                      "total_seconds": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
