"""Train an EAGLE-3 head on the stored self-distillation data: soft cross-entropy to the target's top-k
distribution restricted to the draft vocabulary, over a few training-time-test steps.

Training can run as a curriculum of two phases: plain teacher forcing (one unroll step) for a share of the
budget, then the full unroll from those weights with a fresh optimizer and learning-rate schedule.

Deterministic for a seed (batch order, initialization) unless `max_train_minutes` cuts training short.
A checkpoint (head + optimizer + phase + step) is written after every epoch and resumed from when present
(the loop, shared with the draft-model trainer, is train_loop.py).
"""

import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import structlog
import torch

from draft_training import train_loop
from draft_training.dataset import Batch, DistilledSequence, batch_plan, load_sequences, make_batch
from draft_training.draft_vocab import DraftVocab, choose_draft_vocab, token_mass
from draft_training.train_loop import LoopConfig, make_optimizer
from draft_training.unroll import unrolled_logits
from ssd.errors import InvalidRequestError
from ssd.loader.eagle3_checkpoint import save_eagle3_head
from ssd.loader.safetensors_loader import iter_tensors
from ssd.model_config import load_model_config
from ssd.models.eagle3 import Eagle3Config, Eagle3Head

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class TrainConfig(LoopConfig):
    """An EAGLE-3 head's run: the shared settings (the target's embedding, final norm and LM head seed the head)."""

    batch_tokens: int = 512  # padded head positions per batch (small batches learn faster per second here)
    num_unroll: int = 3  # training-time-test steps; 1 = plain teacher forcing
    # Share of the budget (steps, and time if capped) trained at one unroll step before the full unroll starts
    # from those weights: the first phase learns single-step prediction faster, the second the later positions.
    unroll_warmup_fraction: float = 0.5  # 0 = the full unroll throughout (docs/benchmarks.md: 0.5 won)
    step_decay: float = 0.8  # loss weight of unroll step s is step_decay**s
    is_feature_norm: bool = True  # RMS-normalize each target feature layer before fc (see Eagle3Config)
    aux_layers: tuple[int, int, int] | None = None  # the layers the data's features come from; None = default
    intermediate_size: int | None = None  # the decoder layer's MLP width; None = the target's


def soft_cross_entropy(logits: torch.Tensor, label_ids: torch.Tensor, label_probs: torch.Tensor,
                       weights: torch.Tensor, with_top1: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, L, Vd]; label_ids/probs [B, L, k]; weights [B, L] -> (weighted mean loss, top-1 agreement;
    NaN unless `with_top1`: the argmax over the vocabulary costs ~2% of a step, so only logged steps pay it)."""
    logp = torch.log_softmax(logits, dim=-1)  # [B, L, Vd]
    picked = logp.gather(-1, label_ids.clamp(min=0))  # [B, L, k]
    probs = label_probs / label_probs.sum(-1, keepdim=True).clamp(min=1e-9)  # renormalized to the draft vocab
    per_row = -(probs * picked).sum(-1)  # [B, L]
    weights = weights * (label_probs.sum(-1) > 0)
    loss = (per_row * weights).sum() / weights.sum().clamp(min=1e-9)
    if not with_top1:
        return loss, torch.tensor(float("nan"))
    best = label_ids.gather(-1, label_probs.argmax(-1, keepdim=True))[..., 0]  # [B, L] target's top draft id
    hit = ((logits.argmax(-1) == best) & (weights > 0)).float()
    return loss, hit.sum() / (weights > 0).float().sum().clamp(min=1)


def batch_loss(head: Eagle3Head, batch: Batch, config: TrainConfig,
               with_top1: bool = True) -> tuple[torch.Tensor, list[float], list[float]]:
    """Total weighted loss over the unroll steps, plus per-step loss and top-1 agreement (for logs)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.uses_bf16_autocast):
        hidden = head.fuse(batch.features)  # [B, L, d]
        per_step = unrolled_logits(head, batch.input_ids, hidden, batch.attention_mask, config.num_unroll)
    length = batch.input_ids.shape[1]
    total = torch.zeros(())
    losses, agree = [], []
    for s, logits in enumerate(per_step):
        valid = batch.attention_mask.float()  # [B, L]: step s at j exists only where j is real
        loss, hit = soft_cross_entropy(logits, batch.label_ids[:, s : s + length], batch.label_probs[:, s : s + length],
                                       batch.weights[:, s : s + length] * valid, with_top1)
        total = total + config.step_decay**s * loss
        losses.append(float(loss.detach()))
        agree.append(float(hit))
    return total, losses, agree


def optimizer_step(head: Eagle3Head, optimizer: torch.optim.Optimizer, batch: Batch, config: TrainConfig,
                   with_top1: bool) -> tuple[list[float], list[float]]:
    """One clipped AdamW step on a batch; returns batch_loss's per-unroll-step losses and top-1 agreement."""
    loss = lambda b, top1: batch_loss(head, b, config, top1)  # noqa: E731
    return train_loop.optimizer_step(head, optimizer, loss, batch, config, with_top1)


def init_head(config: TrainConfig, vocab: DraftVocab) -> Eagle3Head:
    """A head shaped after the target; lm_head rows, final norm and embedding copied from the target."""
    target_config = load_model_config(Path(config.target))
    weights = dict(iter_tensors(Path(config.target)))
    embedding = weights["model.embed_tokens.weight"].float()  # [V, d]
    lm_head = weights.get("lm_head.weight", embedding).float()
    torch.manual_seed(config.seed)
    head_config = Eagle3Config.from_target(target_config, vocab.size, aux_layers=config.aux_layers,
                                           feature_norm=config.is_feature_norm)
    if config.intermediate_size is not None:
        head_config = replace(head_config, intermediate_size=config.intermediate_size)
    head = Eagle3Head(head_config, embedding)
    with torch.no_grad():
        head.lm_head.weight.copy_(lm_head[vocab.target_ids])
        head.norm.weight.copy_(weights["model.norm.weight"].float())
        head.d2t.copy_(vocab.d2t)
        head.t2d.copy_(vocab.t2d)
    return head


def _evaluate(head: Eagle3Head, batches: list[Batch], config: TrainConfig) -> dict[str, Any]:
    head.eval()
    losses, agree = [], []
    with torch.no_grad():
        for b in batches:
            _, ls, ag = batch_loss(head, b, config)
            losses.append(ls)
            agree.append(ag)
    head.train()
    mean = lambda rows, s: round(sum(r[s] for r in rows) / len(rows), 4)  # noqa: E731
    return {"val_loss": [mean(losses, s) for s in range(config.num_unroll)],
            "val_top1": [mean(agree, s) for s in range(config.num_unroll)]}


def training_vocab(seqs: list[DistilledSequence], config: TrainConfig) -> DraftVocab:
    """Ranked by the target's probability mass where it writes its own answers (rows P-1.. of self-distilled
    sequences: what the draft must predict when serving), ties and the tail filled by the mass over all rows
    (corpus windows included) at a small weight. Coverage is over the answers' stored top-k mass."""
    vocab_size = load_model_config(Path(config.target)).vocab_size
    answers = [(s.topk_ids[s.prompt_len - 1 :], s.topk_logprobs[s.prompt_len - 1 :]) for s in seqs if s.prompt_len > 0]
    everything = [(s.topk_ids, s.topk_logprobs) for s in seqs]
    mass = lambda rows: token_mass(torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows]), vocab_size)  # noqa: E731
    all_mass = mass(everything)
    if not answers:
        return choose_draft_vocab(all_mass, float(all_mass.sum()), config.draft_vocab_coverage,
                                  config.min_draft_vocab, config.max_draft_vocab)
    answer_mass = mass(answers)
    ranking = answer_mass / answer_mass.sum() + 0.05 * all_mass / all_mass.sum()
    vocab = choose_draft_vocab(ranking, float(ranking.sum()), config.draft_vocab_coverage,
                               config.min_draft_vocab, config.max_draft_vocab)
    covered = float(answer_mass[vocab.target_ids].sum() / answer_mass.sum())
    return DraftVocab(vocab.target_ids, vocab.vocab_size, covered)


def training_phases(config: TrainConfig) -> list[TrainConfig]:
    """The configs trained one after the other: the whole budget at `num_unroll`, or with an unroll warm-up,
    its share at one step and the rest at `num_unroll` (under a time cap, the second phase also gets the time
    the first left when it ran out of steps first: see train_head)."""
    share = config.unroll_warmup_fraction
    if share <= 0.0 or config.num_unroll == 1:
        return [config]
    if share >= 1.0:
        raise InvalidRequestError(f"unroll_warmup_fraction must be below 1 (got {share}): the full unroll needs a share")
    minutes = config.max_train_minutes

    def part(num_unroll: int, fraction: float) -> TrainConfig:
        return replace(config, num_unroll=num_unroll, epochs=config.epochs * fraction, unroll_warmup_fraction=0.0,
                       max_train_minutes=minutes * fraction if minutes else None)

    return [part(1, share), part(config.num_unroll, 1.0 - share)]


def train_head(config: TrainConfig, shards: list[Path], out: Path, checkpoints: Path) -> dict[str, Any]:
    """Train, save the head to `out` (bfloat16), return a summary for the model card."""
    started = time.perf_counter()
    phases = training_phases(config)
    torch.manual_seed(config.seed)
    seqs = load_sequences(shards)
    random.Random(config.seed).shuffle(seqs)
    num_val = max(1, int(len(seqs) * config.validation_fraction))
    val_seqs, train_seqs = seqs[:num_val], seqs[num_val:]
    vocab = training_vocab(train_seqs, config)
    log.info("draft vocabulary", size=vocab.size, coverage=round(vocab.coverage, 4))
    head = init_head(config, vocab)
    head.train()
    t2d_index = vocab.target_to_draft()
    generator = torch.Generator().manual_seed(config.seed)
    val_batches = [make_batch([val_seqs[i] for i in g], t2d_index, config.num_unroll, config.prompt_loss_weight)
                   for g in batch_plan([len(s.tokens) for s in val_seqs], config.batch_tokens, generator)]
    state = train_loop.LoopState(config, train_seqs, checkpoints, [])
    resumed = train_loop.resume(head, checkpoints, config)
    first_phase = resumed["phase"] if resumed else 0
    steps = 0
    train_started = time.perf_counter()
    for index, phase in enumerate(phases):
        if index < first_phase:
            continue
        if index == len(phases) - 1 and config.max_train_minutes:  # the last phase also gets what earlier ones left
            spent = (time.perf_counter() - train_started) / 60
            phase = replace(phase, max_train_minutes=max(config.max_train_minutes - spent, 1e-3))
        optimizer = make_optimizer(head, phase)
        step = 0
        if resumed and index == first_phase:
            optimizer.load_state_dict(resumed["optimizer"])
            step = resumed["step"]
        steps += _train_phase(head, optimizer, state, t2d_index, val_batches, index, phase, step)
    save_eagle3_head(head, out, dtype=torch.bfloat16)
    return {
        "train_config": asdict(config), "aux_layers": list(head.config.aux_layers), "draft_vocab_size": vocab.size,
        "draft_vocab_coverage": round(vocab.coverage, 4), "train_sequences": len(train_seqs),
        "train_positions": sum(state.lengths), "steps": steps, "phases": len(phases),
        "train_seconds": round(time.perf_counter() - started), "validation": state.history,
    }


def _train_phase(head: Eagle3Head, optimizer: torch.optim.Optimizer, state: train_loop.LoopState,
                 t2d_index: torch.Tensor, val_batches: list[Batch], index: int, phase: TrainConfig, step: int) -> int:
    """Train one phase from `step` until its steps or its time run out; returns the steps this phase took in all."""
    objective = train_loop.Objective(
        make_batch=lambda group: make_batch(group, t2d_index, phase.num_unroll, phase.prompt_loss_weight),
        loss=lambda batch, with_top1: batch_loss(head, batch, phase, with_top1),
        evaluate=lambda: _evaluate(head, val_batches, state.run_config))
    return train_loop.train_epochs(head, optimizer, objective, state, phase, index, step,
                                   desc=f"train draft (unroll {phase.num_unroll})")
