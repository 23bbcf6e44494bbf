"""Time draft-head training steps on stored self-distillation shards (no data generation).

    python -m draft_training.bench_train_step --work-dir WORK --answer-shards 2 --corpus-shards 1 [--profile]

WORK is a `ssd train-draft --work-dir` folder (its data/ and corpus/ shards). Builds the draft vocabulary and the
batches as training does (seed 0), runs 5 warm-up steps, then prints seconds per step over the next `--steps`
batches; `--profile` adds a torch.profiler table of 10 more steps. Options of TrainConfig pass as key=value
(e.g. `num_unroll=1`). Used for docs/benchmarks.md's training step-time entries; compare two commits by
running it in each checkout one after the other.
"""

import argparse
import json
import time
from pathlib import Path

import torch

from draft_training.dataset import Batch, batch_plan, load_sequences, make_batch
from draft_training.trainer import TrainConfig, init_head, make_optimizer, optimizer_step, training_vocab
from ssd.model_store import resolve_model


def _option(text: str) -> tuple[str, bool | int | float]:
    key, _, value = text.partition("=")
    if key.startswith("is_"):
        return key, value == "1"
    return key, float(value) if "." in value else int(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--answer-shards", type=int, default=2)
    parser.add_argument("--corpus-shards", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("options", nargs="*", type=_option, help="TrainConfig fields as key=value")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(args.work_dir)
    shards = (sorted((work / "data").glob("shard-*.safetensors"))[: args.answer_shards]
              + sorted((work / "corpus").glob("corpus-*.safetensors"))[: args.corpus_shards])
    config = TrainConfig(target=str(resolve_model(args.model)), **dict(args.options))
    seqs = load_sequences(shards)
    vocab = training_vocab(seqs, config)
    head = init_head(config, vocab)
    head.train()
    t2d = vocab.target_to_draft()
    plan = batch_plan([len(s.tokens) for s in seqs], config.batch_tokens, torch.Generator().manual_seed(0))
    needed = 5 + args.steps + (10 if args.profile else 0)
    if len(plan) < needed:
        parser.error(f"{len(plan)} batches in these shards, {needed} needed; add shards or lower --steps")
    batches = [make_batch([seqs[i] for i in g], t2d, config.num_unroll, config.prompt_loss_weight) for g in plan[:needed]]
    optimizer = make_optimizer(head, config)

    def step(batch: Batch) -> None:
        optimizer_step(head, optimizer, batch, config, with_top1=False)

    for b in batches[:5]:
        step(b)
    started = time.perf_counter()
    for b in batches[5 : 5 + args.steps]:
        step(b)
    seconds = (time.perf_counter() - started) / args.steps
    print(json.dumps({"s_per_step": round(seconds, 4), "steps": args.steps, "draft_vocab": vocab.size,
                      "batch_tokens": config.batch_tokens, "num_unroll": config.num_unroll}))
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for b in batches[5 + args.steps :]:
                step(b)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
