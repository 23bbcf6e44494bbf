"""Train a small draft model (`ssd train-draft --kind model`) on the stored self-distillation data.

The draft is a Llama of N decoder layers copied from the target's (evenly spaced from the first to the last:
the first layers build the token representation and the last ones map it to next-token space, so keeping both
ends gives a usable model before any training, unlike the first N layers alone), the target's input embedding
(frozen, not saved: shared from the target), its final norm, and an LM head over the trimmed draft vocabulary
(the EAGLE-3 head's choice, trainer.training_vocab) seeded with the target's LM-head rows. Loss: soft
cross-entropy to the target's stored top-k distribution restricted to the draft vocabulary. The loop,
schedule, progress bars and checkpoints are train_loop.py's. Saved as ssd/loader/draft_checkpoint.py describes.
"""

import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog
import torch
from torch import nn

from draft_training import train_loop
from draft_training.dataset import DistilledSequence, ModelBatch, batch_plan, load_sequences, make_model_batch
from draft_training.draft_vocab import DraftVocab
from draft_training.trainer import soft_cross_entropy, training_vocab
from ssd.errors import InvalidRequestError
from ssd.loader.draft_checkpoint import EMBED_KEY, save_draft_model
from ssd.loader.safetensors_loader import iter_tensors
from ssd.model_config import load_model_config

log = structlog.get_logger(__name__)

# Copied beside the weights so the folder tokenizes and templates by itself (the draft service's grammars need it)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")


@dataclass(frozen=True)
class ModelTrainConfig(train_loop.LoopConfig):
    """A draft model's run: the shared settings (the target's layers, embedding, norm and LM head seed it)."""

    num_layers: int = 3
    init_layers: tuple[int, ...] | None = None  # the target layers copied in; None = evenly spaced first..last
    lr: float = 5e-4  # lower than the head's 1e-3: the layers start trained
    batch_tokens: int = 1024  # padded positions per batch


def init_layer_indices(num_target_layers: int, num_layers: int) -> tuple[int, ...]:
    """`num_layers` target layer indices, evenly spaced from the first to the last (increasing, distinct)."""
    if not 1 <= num_layers <= num_target_layers:
        raise InvalidRequestError(f"--layers must be 1..{num_target_layers} (the target's depth), got {num_layers}")
    if num_layers == 1:
        return (num_target_layers - 1,)
    return tuple(round(i * (num_target_layers - 1) / (num_layers - 1)) for i in range(num_layers))


def _draft_hf_config(target: Path, num_layers: int) -> dict[str, Any]:
    raw = dict(load_model_config(target).raw)
    raw.update(num_hidden_layers=num_layers, architectures=["LlamaForCausalLM"], tie_word_embeddings=False)
    return raw


def build_draft(config: ModelTrainConfig, vocab: DraftVocab) -> nn.Module:
    """An HF LlamaForCausalLM (float32) of `num_layers` layers from the target, its LM head trimmed to `vocab`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    target = Path(config.target)
    raw = _draft_hf_config(target, config.num_layers)
    layers = config.init_layers or init_layer_indices(load_model_config(target).num_hidden_layers, config.num_layers)
    if len(layers) != config.num_layers:
        raise InvalidRequestError(f"init layers {list(layers)} are not {config.num_layers} layers")
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(LlamaConfig(**raw))
    model.lm_head = nn.Linear(model.config.hidden_size, vocab.size, bias=False)
    weights = dict(iter_tensors(target))
    rename = {f"model.layers.{src}.": f"model.layers.{dst}." for dst, src in enumerate(layers)}
    state = {}
    for name, tensor in weights.items():
        for src, dst in rename.items():
            if name.startswith(src):
                state[dst + name[len(src):]] = tensor
        if name in (EMBED_KEY, "model.norm.weight"):
            state[name] = tensor
    state["lm_head.weight"] = weights.get("lm_head.weight", weights[EMBED_KEY])[vocab.target_ids]
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise InvalidRequestError(f"{target} does not fit a Llama draft: missing {missing}, unexpected {unexpected}")
    model.model.embed_tokens.weight.requires_grad_(False)  # shared with the target, never trained
    return model


def draft_logits(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:  # [B, L] -> [B, L, Vd]
    """Causal forward; right padding needs no mask (a real position never sees a later pad)."""
    hidden = model.model(input_ids=input_ids, use_cache=False).last_hidden_state  # [B, L, d]
    return model.lm_head(hidden)


def model_loss(model: nn.Module, batch: ModelBatch, config: ModelTrainConfig,
               with_top1: bool = True) -> tuple[torch.Tensor, list[float], list[float]]:
    """Weighted soft cross-entropy to the target over the draft vocabulary (one "step": the next token)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.uses_bf16_autocast):
        logits = draft_logits(model, batch.input_ids)  # [B, L, Vd]
    loss, hit = soft_cross_entropy(logits.float(), batch.label_ids, batch.label_probs,
                                   batch.weights * batch.attention_mask, with_top1)
    return loss, [float(loss.detach())], [float(hit)]


def _evaluate(model: nn.Module, batches: list[ModelBatch], config: ModelTrainConfig) -> dict[str, Any]:
    model.eval()
    with torch.no_grad():
        rows = [model_loss(model, b, config)[1:] for b in batches]
    model.train()
    return {"val_loss": [round(sum(r[0][0] for r in rows) / len(rows), 4)],
            "val_top1": [round(sum(r[1][0] for r in rows) / len(rows), 4)]}


def save_trained_draft(model: nn.Module, vocab: DraftVocab, out: Path, target: Path, dtype: torch.dtype) -> None:
    """The draft folder: weights in `dtype` without the shared embedding, d2t, config, the target's tokenizer."""
    weights = {k: v.to(dtype) for k, v in model.state_dict().items() if k != EMBED_KEY}
    config = {**_draft_hf_config(target, model.config.num_hidden_layers), "dtype": str(dtype).removeprefix("torch.")}
    save_draft_model(out, config, weights, vocab.target_ids, target)
    for name in TOKENIZER_FILES:
        if (target / name).is_file():
            shutil.copyfile(target / name, out / name)


def _split(config: ModelTrainConfig, shards: list[Path]) -> tuple[list[DistilledSequence], list[DistilledSequence]]:
    seqs = load_sequences(shards, with_features=False)
    random.Random(config.seed).shuffle(seqs)
    num_val = max(1, int(len(seqs) * config.validation_fraction))
    return seqs[num_val:], seqs[:num_val]


def train_draft_model(config: ModelTrainConfig, shards: list[Path], out: Path, checkpoints: Path,
                      dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """Train, save the draft to `out` (weights in `dtype`), return a summary for the model card."""
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    train_seqs, val_seqs = _split(config, shards)
    vocab = training_vocab(train_seqs, config)
    log.info("draft vocabulary", size=vocab.size, coverage=round(vocab.coverage, 4))
    model = build_draft(config, vocab)
    model.train()
    t2d_index = vocab.target_to_draft()
    make = lambda group: make_model_batch(group, t2d_index, config.prompt_loss_weight)  # noqa: E731
    plan = batch_plan([len(s.tokens) for s in val_seqs], config.batch_tokens, torch.Generator().manual_seed(config.seed))
    val_batches = [make([val_seqs[i] for i in g]) for g in plan]
    state = train_loop.LoopState(config, train_seqs, checkpoints, [])
    objective = train_loop.Objective(make, lambda batch, top1: model_loss(model, batch, config, top1),
                                     lambda: _evaluate(model, val_batches, config))
    optimizer = train_loop.make_optimizer(model, config)
    resumed = train_loop.resume(model, checkpoints, config)
    if resumed:
        optimizer.load_state_dict(resumed["optimizer"])
    steps = train_loop.train_epochs(model, optimizer, objective, state, config, 0,
                                    resumed["step"] if resumed else 0, desc=f"train draft model ({config.num_layers} layers)")
    save_trained_draft(model, vocab, out, Path(config.target), dtype)
    layers = config.init_layers or init_layer_indices(load_model_config(Path(config.target)).num_hidden_layers,
                                                      config.num_layers)
    return {
        "kind": "model", "train_config": asdict(config), "init_layers": list(layers), "draft_vocab_size": vocab.size,
        "draft_vocab_coverage": round(vocab.coverage, 4), "train_sequences": len(train_seqs),
        "train_positions": sum(state.lengths), "steps": steps, "phases": 1,
        "train_seconds": round(time.perf_counter() - started), "validation": state.history,
    }
