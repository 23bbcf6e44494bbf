"""The `ssd train-draft` and `ssd eval-draft` commands: flags -> frozen configs -> data, training, evaluation."""

import argparse
import json
import sys
import time
from pathlib import Path

import structlog

from ssd.cli_flags import STEP_FIELDS, add_config_flags, options_from_args
from ssd.config import EngineConfig
from ssd.errors import InvalidRequestError

log = structlog.get_logger(__name__)
EVAL_ENGINE_FIELDS = ("dtype", "num_threads", *STEP_FIELDS)  # the target engine of eval-draft


def _resolve(name: str) -> str:
    from ssd.model_store import resolve_model

    return str(resolve_model(name))


def _cmd_train(args: argparse.Namespace) -> int:
    import torch

    from draft_training.corpus import CorpusConfig, generate_corpus_data
    from draft_training.data_gen import DataConfig, generate_data

    torch.set_num_threads(args.num_threads or torch.get_num_threads())
    started = time.perf_counter()
    out = Path(args.out)
    from ssd.paths import cache_root

    work = Path(args.work_dir) if args.work_dir else cache_root() / "draft-training" / out.resolve().name
    data_dir = work / "data"
    data = DataConfig(
        target=_resolve(args.target), seed=args.seed, num_chat=args.num_chat, num_code_stubs=args.num_code_stubs,
        num_code_chat=args.num_code_chat, num_docs=args.num_docs, num_tasks=args.num_tasks,
        max_new_tokens=args.max_new_tokens,
        top_k=args.top_k, dtype=args.dtype, num_threads=args.num_threads, max_shards=args.max_data_shards,
        aux_layers=args.aux_layers,
    )
    aux_layers = data.resolved_aux_layers()  # checked against the target's depth before any work starts
    shards = generate_data(data, data_dir)
    if args.num_corpus_windows:
        corpus = CorpusConfig(target=data.target, aux_layers=aux_layers, seed=args.seed,
                              num_windows=args.num_corpus_windows, top_k=args.top_k, dtype=args.dtype)
        shards += generate_corpus_data(corpus, work / "corpus")
    data_s = time.perf_counter() - started
    log.info("draft data ready", shards=len(shards), seconds=round(data_s))
    if args.data_only:
        return 0
    max_train_minutes = _train_minutes(args.max_train_minutes, args.max_total_minutes, data_s)
    checkpoints = work / ("checkpoints" if args.kind == "eagle3" else f"checkpoints-model-{args.layers}")
    summary = _train(args, data.target, shards, out, checkpoints, max_train_minutes, aux_layers)
    num_generated = sum(1 for p in shards if p.name.startswith("shard-"))
    summary.update(
        data_seconds=round(data_s), total_seconds=round(time.perf_counter() - started), top_k=args.top_k,
        command="ssd " + " ".join(sys.argv[1:]),
        data_description=(f"{num_generated} shard(s) x 64 training prompts (templates x topics, generated tasks "
                          f"(extraction, math, reasoning, role-play, constrained writing, editing), standard-library "
                          f"function stubs and code questions, package docs) answered greedily by the target "
                          f"(<= {args.max_new_tokens} tokens), plus {args.num_corpus_windows} teacher-forced "
                          "384-token windows of standard-library source and package descriptions. "
                          "No MT-Bench or HumanEval text."),
    )
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log.info("train-draft done", **summary)
    return 0


def _train(args: argparse.Namespace, target: str, shards: list[Path], out: Path, checkpoints: Path,
           max_train_minutes: float | None, aux_layers: tuple[int, int, int]) -> dict:
    """Train the draft `--kind` names on the data stage; returns its summary."""
    common = {k: v for k, v in {"lr": args.lr, "batch_tokens": args.batch_tokens}.items() if v is not None}
    vocab = dict(draft_vocab_coverage=args.vocab_coverage, min_draft_vocab=args.min_draft_vocab,
                 max_draft_vocab=args.max_draft_vocab, prompt_loss_weight=args.prompt_loss_weight)
    if args.kind == "model":
        from draft_training.model_trainer import ModelTrainConfig, train_draft_model

        config = ModelTrainConfig(target=target, num_layers=args.layers, init_layers=args.init_layers, seed=args.seed,
                                  epochs=args.epochs, max_train_minutes=max_train_minutes, **common, **vocab)
        return train_draft_model(config, shards, out, checkpoints)
    from draft_training.trainer import TrainConfig, train_head

    train = TrainConfig(
        target=target, seed=args.seed, epochs=args.epochs, num_unroll=args.unroll,
        unroll_warmup_fraction=args.unroll_warmup_fraction, max_train_minutes=max_train_minutes,
        aux_layers=aux_layers, intermediate_size=args.intermediate_size, **common, **vocab,
    )
    return train_head(train, shards, out, checkpoints)


def _layer_list(text: str) -> tuple[int, ...]:
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        layers = ()
    if not layers or min(layers) < 0 or list(layers) != sorted(set(layers)):
        raise argparse.ArgumentTypeError(f"expected increasing layer indices like 0,10,19,29; got {text!r}")
    return layers


# Loading the data, the last validation pass and saving the head take about this long after training stops.
TRAIN_OVERHEAD_MINUTES = 3.0


def _train_minutes(max_train: float | None, max_total: float | None, data_seconds: float) -> float | None:
    """The training time cap: --max-train-minutes, tightened so data + training fit in --max-total-minutes."""
    if max_total is None:
        return max_train
    left = max_total - data_seconds / 60 - TRAIN_OVERHEAD_MINUTES
    if left < 1.0:
        raise InvalidRequestError(f"--max-total-minutes {max_total:g} leaves no time to train: the data stage "
                                  f"took {data_seconds / 60:.1f} minutes")
    capped = round(left if max_train is None else min(max_train, left), 1)
    log.info("training time capped", max_train_minutes=capped, max_total_minutes=max_total,
             data_minutes=round(data_seconds / 60, 1))
    return capped


def _cmd_eval(args: argparse.Namespace) -> int:
    from bench.datasets import load_prompts  # noqa: PLC0415 - the held-out sets live with the benchmarks
    from draft_training.evaluate import EvalConfig, HeldOutPrompt, evaluate_head, format_report
    from ssd.speculation.factory import is_eagle3_folder

    prompts = [HeldOutPrompt(p.dataset, p.text, p.is_chat) for p in load_prompts("all", args.num_prompts)]
    engine = EngineConfig(_resolve(args.target), **options_from_args(args, EVAL_ENGINE_FIELDS))
    config = EvalConfig(engine, draft=args.draft, num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens,
                        tree_budget=args.tree_budget)
    if is_eagle3_folder(Path(_resolve(args.draft))):
        report = evaluate_head(config, prompts)
    else:  # a draft model (`train-draft --kind model`)
        from draft_training.model_eval import evaluate_draft_model

        report = evaluate_draft_model(config, prompts)
    text = format_report(report)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    summary_path = Path(args.draft) / "train_summary.json"
    if args.write_card and summary_path.is_file():
        from draft_training.model_card import render_model_card

        summary = json.loads(summary_path.read_text())
        card = render_model_card(Path(args.draft).name, args.target, summary["command"], summary, report)
        (Path(args.draft) / "MODEL_CARD.md").write_text(card)
    return 0


def _aux_layers(text: str) -> tuple[int, int, int]:
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        layers = ()
    if len(layers) != 3 or min(layers) < 0 or list(layers) != sorted(set(layers)):
        raise argparse.ArgumentTypeError(f"expected three increasing layer indices like 2,15,27; got {text!r}")
    return layers  # type: ignore[return-value]


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1); got {text!r}")
    return value


def add_draft_training_commands(sub: argparse._SubParsersAction) -> None:
    """Register `train-draft` and `eval-draft` on the `ssd` command's subparsers."""
    t = sub.add_parser("train-draft", help="train a draft for a target by self-distillation: an EAGLE-3 head "
                                           "(--kind eagle3) or a small draft model (--kind model)")
    t.add_argument("--target", required=True, help="target checkpoint folder or known model name")
    t.add_argument("--out", required=True, help="folder for the trained head (config.json, model.safetensors)")
    t.add_argument("--work-dir", default=None,
                   help="feature cache and checkpoints (resumable); default <cache>/draft-training/<OUT name>; "
                        "another run's folder reuses its data stage (each kind keeps its own checkpoints)")
    t.add_argument("--data-only", action="store_true", help="stop after generating the training data")
    t.add_argument("--kind", choices=("eagle3", "model"), default="eagle3",
                   help="eagle3: a head over the target's features; model: a small Llama of --layers target layers "
                        "with the target's embedding (shared, not saved) and a trimmed LM head")
    t.add_argument("--layers", type=int, default=3, help="--kind model: decoder layers of the draft")
    t.add_argument("--init-layers", type=_layer_list, default=None, metavar="I,J,..",
                   help="--kind model: the target layers copied into the draft (default: --layers of them, evenly "
                        "spaced from the first to the last)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--num-chat", type=int, default=400)
    t.add_argument("--num-code-stubs", type=int, default=176)
    t.add_argument("--num-code-chat", type=int, default=208)
    t.add_argument("--num-docs", type=int, default=80)
    t.add_argument("--num-tasks", type=int, default=320,
                   help="generated MT-Bench-like requests (extraction, math, reasoning, role-play, writing, ...)")
    t.add_argument("--max-new-tokens", type=int, default=256)
    t.add_argument("--max-data-shards", type=int, default=None,
                   help="generate only the first N shards of 64 prompts (a fixed prefix); default all 19")
    t.add_argument("--num-corpus-windows", type=int, default=512,
                   help="teacher-forced windows of real text (stdlib source, package docs); 0 = none")
    t.add_argument("--aux-layers", type=_aux_layers, default=None, metavar="A,B,C",
                   help="the three target layers whose entering residual stream the head reads; default 2,L/2,L-3")
    t.add_argument("--top-k", type=int, default=16, help="target log-probs kept per position")
    add_config_flags(t, ("dtype", "num_threads"), whose="the target's (for the data)")
    t.add_argument("--epochs", type=float, default=8.0)
    t.add_argument("--lr", type=float, default=None, help="default: 1e-3 (eagle3), 5e-4 (model)")
    t.add_argument("--batch-tokens", type=int, default=None, help="padded positions a batch; default 512 (eagle3), "
                                                                   "1024 (model)")
    t.add_argument("--unroll", type=int, default=3, help="training-time-test steps (1 = no unroll)")
    t.add_argument("--unroll-warmup-fraction", type=_fraction, default=0.5, metavar="F",
                   help="share of the training budget spent at one unroll step before the full --unroll starts "
                        "from those weights (fresh optimizer and schedule); 0 = the full unroll throughout")
    t.add_argument("--intermediate-size", type=int, default=None,
                   help="the head's MLP width (default: the target's); wider costs step time and checkpoint size")
    t.add_argument("--vocab-coverage", type=float, default=0.95)
    t.add_argument("--min-draft-vocab", type=int, default=8192)
    t.add_argument("--max-draft-vocab", type=int, default=12288)
    t.add_argument("--prompt-loss-weight", type=float, default=0.3)
    t.add_argument("--max-train-minutes", type=float, default=None, help="stop training after this long")
    t.add_argument("--max-total-minutes", type=float, default=None,
                   help="time budget for data + training: training stops early enough for the whole run to fit")
    t.set_defaults(func=_cmd_train)

    e = sub.add_parser("eval-draft", help="acceptance of a draft (an EAGLE-3 head or a draft model) on held-out "
                                          "MT-Bench + HumanEval prompts")
    e.add_argument("--target", required=True)
    e.add_argument("--draft", required=True)
    e.add_argument("--num-prompts", type=int, default=16, help="per data set")
    e.add_argument("--max-new-tokens", type=int, default=128)
    e.add_argument("--tree-budget", type=int, default=16, help="draft tokens in the token tree")
    add_config_flags(e, EVAL_ENGINE_FIELDS, whose="the target's")
    e.add_argument("--json", default=None, help="also write the report as JSON here")
    e.add_argument("--write-card", action="store_true",
                   help="render MODEL_CARD.md into the draft folder from its train_summary.json and this report")
    e.set_defaults(func=_cmd_eval)
