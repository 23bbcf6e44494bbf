"""The training loop every draft kind shares: AdamW, linear warm-up + cosine decay over progress (steps, or the
time budget when that runs out first), length-bucketed shuffled batches, progress bars, a validation pass and
an atomic checkpoint (model + optimizer + phase + step) after every epoch, resumed from when present.

What is trained is an `Objective`: how a batch is made from stored sequences and its loss (trainer.py: an
EAGLE-3 head; model_trainer.py: a small draft model). Deterministic for a seed unless a time cap stops it.
"""

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog
import torch
from torch import nn
from tqdm.auto import tqdm

from draft_training.dataset import DistilledSequence, batch_plan
from ssd.dtypes import cpu_has_fast_bfloat16

log = structlog.get_logger(__name__)

LOG_EVERY = 20  # training steps between progress-bar updates and log lines of loss and top-1


@dataclass(frozen=True)
class LoopConfig:
    """The settings every draft kind trains under (TrainConfig and ModelTrainConfig extend it)."""

    target: str  # target checkpoint folder (it seeds the draft)
    seed: int = 0
    epochs: float = 8.0
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 30
    batch_tokens: int = 512  # padded positions per batch
    draft_vocab_coverage: float = 0.95
    min_draft_vocab: int = 8192
    max_draft_vocab: int = 12288
    prompt_loss_weight: float = 0.3  # weight of positions predicting prompt tokens (answers weigh 1)
    validation_fraction: float = 0.04
    max_train_minutes: float | None = None
    grad_clip: float = 1.0
    # bf16 matmuls (oneDNN) with float32 weights: ~1.5-2x faster on CPUs with native bf16, ~7x slower on AVX2-only
    # ones (Zen 3); None = on where the CPU has it (ssd.dtypes.cpu_has_fast_bfloat16)
    is_bf16_autocast: bool | None = None

    @property
    def uses_bf16_autocast(self) -> bool:
        return cpu_has_fast_bfloat16() if self.is_bf16_autocast is None else self.is_bf16_autocast


# loss(batch, with_top1) -> (total loss to minimize, per-step losses, per-step top-1 agreement; NaN unless with_top1)
LossFn = Callable[[Any, bool], tuple[torch.Tensor, list[float], list[float]]]


@dataclass(frozen=True)
class Objective:
    """What a run optimizes: batches made from sequences, their loss, and the validation metrics."""

    make_batch: Callable[[list[DistilledSequence]], Any]
    loss: LossFn
    evaluate: Callable[[], dict[str, Any]]  # over the held-out batches, in eval mode


@dataclass
class LoopState:
    """One run's fixed inputs and its history, shared by its phases."""

    run_config: Any  # the run's whole config (a dataclass): checkpoints are only resumed under the same one
    train_seqs: list[DistilledSequence]
    checkpoints: Path
    history: list[dict[str, Any]]

    @property
    def lengths(self) -> list[int]:
        return [len(s.tokens) for s in self.train_seqs]


def trained_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]  # shared embeddings stay frozen


def make_optimizer(model: nn.Module, config: LoopConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(trained_parameters(model), lr=config.lr, weight_decay=config.weight_decay,
                             betas=(0.9, 0.95), fused=True)  # one kernel for all parameters (the per-tensor loop was ~7% of a step)


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss: LossFn, batch: Any,
                   config: LoopConfig, with_top1: bool) -> tuple[list[float], list[float]]:
    """One clipped AdamW step on a batch; returns the loss's per-step losses and top-1 agreement."""
    total, losses, agree = loss(batch, with_top1)
    optimizer.zero_grad(set_to_none=True)
    total.backward()
    torch.nn.utils.clip_grad_norm_(trained_parameters(model), config.grad_clip)
    optimizer.step()
    return losses, agree


def train_epochs(model: nn.Module, optimizer: torch.optim.Optimizer, objective: Objective, state: LoopState,
                 phase: LoopConfig, index: int, step: int, desc: str) -> int:
    """Train phase `index` from `step` until its steps or its time run out; returns the steps it took in all."""
    lengths = state.lengths
    steps_per_epoch = len(batch_plan(lengths, phase.batch_tokens, torch.Generator().manual_seed(0)))
    total_steps = max(1, int(phase.epochs * steps_per_epoch))
    log.info("training", phase=index, desc=desc, sequences=len(state.train_seqs), positions=sum(lengths),
             steps=total_steps, steps_per_epoch=steps_per_epoch, resumed_at=step,
             params=sum(p.numel() for p in trained_parameters(model)))
    bar = tqdm(total=total_steps, initial=step, desc=desc, unit="step")
    started = time.perf_counter()
    progress = lambda: max(step / total_steps, time_fraction(started, phase.max_train_minutes))  # noqa: E731
    epoch = step // steps_per_epoch
    while progress() < 1.0:
        plan = batch_plan(lengths, phase.batch_tokens, torch.Generator().manual_seed(phase.seed + epoch))
        for group in plan[step % steps_per_epoch :]:
            lr = learning_rate(phase, step, progress())
            for g in optimizer.param_groups:
                g["lr"] = lr
            is_logged = (step + 1) % LOG_EVERY == 0
            batch = objective.make_batch([state.train_seqs[i] for i in group])
            losses, agree = optimizer_step(model, optimizer, objective.loss, batch, phase, is_logged)
            step += 1
            bar.update(1)
            if is_logged:
                bar.set_postfix(loss=f"{losses[0]:.3f}", top1=f"{agree[0]:.3f}")
                log.info("train step", phase=index, step=step, loss=[round(x, 3) for x in losses],
                         top1=[round(x, 3) for x in agree], lr=round(lr, 6), progress=round(progress(), 3))
            if progress() >= 1.0:
                break
        epoch += 1
        metrics = objective.evaluate()
        state.history.append({"phase": index, "step": step, **metrics})
        log.info("validation", phase=index, epoch=epoch, step=step, **metrics)
        save_checkpoint(model, optimizer, index, step, state.checkpoints, state.run_config)
    bar.close()
    return step


def time_fraction(started: float, max_minutes: float | None) -> float:
    return (time.perf_counter() - started) / (60 * max_minutes) if max_minutes else 0.0


def learning_rate(config: LoopConfig, step: int, progress: float) -> float:
    """Linear warm-up, then cosine decay over training progress (steps, or the time budget if that runs out first)."""
    warmup = min(1.0, (step + 1) / config.warmup_steps)
    return config.lr * warmup * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def save_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, phase: int, step: int,
                    folder: Path, config: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    state = {"head": model.state_dict(), "optimizer": optimizer.state_dict(), "phase": phase, "step": step,
             "config": asdict(config)}
    tmp = folder / "latest.pt.tmp"
    torch.save(state, tmp)
    tmp.rename(folder / "latest.pt")


# Options added after checkpoints were first written, with the value an older checkpoint was trained with.
_ADDED_OPTIONS = {"unroll_warmup_fraction": 0.0}


def trained_options(config: dict[str, Any]) -> dict[str, Any]:
    """The options that decide what a checkpoint holds; a time cap only decides when training stops."""
    return {k: v for k, v in {**_ADDED_OPTIONS, **config}.items() if k != "max_train_minutes"}


def resume(model: nn.Module, folder: Path, config: Any) -> dict[str, Any] | None:
    """Load the checkpoint's model; return its optimizer state, phase and step (None: start from scratch)."""
    path = folder / "latest.pt"
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=False)
    if trained_options(state["config"]) != trained_options(asdict(config)):
        log.warning("checkpoint was trained with other options; starting over", checkpoint=str(path))
        return None
    model.load_state_dict(state["head"])
    return {"optimizer": state["optimizer"], "phase": int(state.get("phase", 0)), "step": int(state["step"])}
