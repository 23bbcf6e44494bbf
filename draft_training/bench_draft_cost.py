"""Time a small draft model's K steps against one target verify of K+1 positions (batch 1), for several draft
depths N, interleaved round by round in one process; prints the medians, their ratio and each folder's size.

    taskset -c 1 python -m draft_training.bench_draft_cost --target smollm2-135m-instruct --layers 2,3,4,6 --k 4,5

The drafts are untrained (`--kind model` initialization: timing does not depend on the weights), saved as
`ssd train-draft --kind model` saves them (bfloat16, trimmed LM head of --draft-vocab rows, shared embedding).
A draft round is one propose of K tokens on a cached context: K forwards of one token (the catch-up, then K-1
steps). The verify is one forward of K+1 tokens on the same context length. Used for the choice of N
(docs/training.md); the machine is shared, so read the ratios, not the times.
"""

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from draft_training.draft_vocab import DraftVocab
from draft_training.model_trainer import ModelTrainConfig, build_draft, save_trained_draft
from ssd.context import ForwardMode
from ssd.model_store import resolve_model
from ssd.runtime.model_runner import ForwardItem
from ssd.runtime.model_worker import ModelWorker
from ssd.speculation.draft_model import DraftModelProposer, _DraftSeq
from ssd.speculation.proposer import ProposeRequest


def _untrained_draft(target: Path, num_layers: int, vocab_size: int, folder: Path) -> Path:
    config = ModelTrainConfig(target=str(target), num_layers=num_layers)
    vocab = DraftVocab(torch.arange(vocab_size), vocab_size, 1.0)
    model = build_draft(config, vocab)
    save_trained_draft(model, vocab, folder, target, torch.bfloat16)
    return folder


def _verify_fn(worker: ModelWorker, context: list[int], k: int) -> Callable[[], None]:
    """One target forward over the last k+1 tokens of `context` (its KV before them written once)."""
    state = _DraftSeq()
    worker.block_manager.ensure_capacity(state, len(context))
    start = len(context) - k - 1
    worker.runner.forward([ForwardItem(context[:start], 0, state.block_table)], ForwardMode.PREFILL)
    item = ForwardItem(context[start:], start, state.block_table, num_logits=k + 1)
    return lambda: worker.runner.forward([item], ForwardMode.VERIFY)


def _draft_fn(proposer: DraftModelProposer, seq_id: int, context: list[int], k: int) -> Callable[[], None]:
    request = ProposeRequest(seq_id, context, k, 0.0, torch.Generator())
    proposer.propose([request])  # writes the context's KV; each later call re-drafts from its last token
    return lambda: proposer.propose([request])


def _time(fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--layers", default="2,3,4,6")
    p.add_argument("--k", default="4,5")
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--context", type=int, default=256, help="tokens already in the KV cache")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = resolve_model(args.target)
    layers, ks = [int(x) for x in args.layers.split(",")], [int(x) for x in args.k.split(",")]
    context = torch.randint(0, args.draft_vocab, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    worker = ModelWorker(target, args.dtype, 16, 256, enable_prefix_caching=False)
    options: dict[str, Callable[[], None]] = {f"verify K+1={k + 1}": _verify_fn(worker, context, k) for k in ks}
    sizes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in layers:
            folder = _untrained_draft(target, n, args.draft_vocab, Path(tmp) / f"draft-{n}")
            sizes[n] = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
            proposer = DraftModelProposer(folder, args.dtype, worker.model_config.vocab_size)
            for k in ks:
                options[f"draft N={n} K={k}"] = _draft_fn(proposer, len(options), context, k)
        for fn in options.values():  # warm-up
            fn()
        samples: dict[str, list[float]] = {name: [] for name in options}
        for _ in range(args.rounds):
            for name, fn in options.items():
                samples[name].append(_time(fn))
    median = {name: statistics.median(v) for name, v in samples.items()}
    print(f"threads={args.threads} dtype={args.dtype} context={args.context} rounds={args.rounds} "
          f"draft_vocab={args.draft_vocab}")
    for k in ks:
        print(f"verify of {k + 1} positions: {median[f'verify K+1={k + 1}']:.2f} ms")
    print("N  K  draft ms (K steps)  ms/step  draft/verify  folder MB")
    for n in layers:
        for k in ks:
            d = median[f"draft N={n} K={k}"]
            print(f"{n}  {k}  {d:18.2f}  {d / k:7.2f}  {d / median[f'verify K+1={k + 1}']:12.2f}  {sizes[n]:9.1f}")


if __name__ == "__main__":
    main()
