"""Builds the draft service's proposer from its config through the library's factory (ssd/speculation/factory.py).

An EAGLE-3 head drafts from its target's features (sent by the target over the session) and its
target's input embedding, which the draft loads once from the target checkpoint (`--target-model`).
A neural draft (checkpoint or head) is also wrapped in an SsdSpeculator that answers SSD sequences, and
gets a grammar compiler over its tokenizer (the target's, for a head), so it drafts structured output under
the request's grammar.
"""

from dataclasses import dataclass, replace
from pathlib import Path

import structlog
import torch
from safetensors import safe_open

from draft_service.config import DraftServiceConfig
from ssd.errors import CheckpointError, InvalidRequestError
from ssd.loader.safetensors_loader import checkpoint_files
from ssd.model_config import load_model_config
from ssd.model_store import ensure_model
from ssd.sampling.grammar import GrammarCompiler
from ssd.speculation.factory import DraftSite, build_neural_proposer, is_eagle3_folder, ssd_speculator
from ssd.speculation.ngram import NgramProposer
from ssd.speculation.proposer import Proposer
from ssd.speculation.ssd_speculator import SsdSpeculator
from ssd.tokenizer import eos_token_ids, load_tokenizer

log = structlog.get_logger(__name__)

EMBEDDING_KEY = "model.embed_tokens.weight"  # the target's input embedding in the HF layout


@dataclass(frozen=True)
class ServiceDraft:
    """What the service serves: the proposer and the facts a session checks the target against."""

    proposer: Proposer
    vocab_size: int  # 0 = any vocabulary (n-gram)
    feature_width: int = 0  # F of the target features [n, F] the proposer drafts from; 0 = needs none
    ssd: SsdSpeculator | None = None  # wraps `proposer` for SSD sequences (neural drafts); None = plain SD only
    device: torch.device = torch.device("cpu")  # where the draft's model lives (features are decoded there)
    grammars: GrammarCompiler | None = None  # compiles a Prefill's grammar; None = drafts ignore grammars
    max_model_len: int = 0  # positions the draft's model has (a sequence's length limit); 0 = none (n-gram)


def build_service_proposer(config: DraftServiceConfig) -> ServiceDraft:
    if config.draft == "ngram":
        return ServiceDraft(NgramProposer(max_ngram=config.ngram_max), 0)
    device = torch.device(config.engine.device)
    path = ensure_model(config.draft)  # a known model not cached yet is pulled (unless SSD_OFFLINE=1)
    engine = config.engine
    site = DraftSite(device, 0, engine.block_size,  # the target's block size, by default 16
                     prefix_cache_blocks=config.prefix_cache_blocks, kv_cache_memory_mb=engine.kv_cache_memory_mb,
                     compile=engine.compile, enforce_eager=engine.enforce_eager,
                     attention_backend=engine.attention_backend)
    if is_eagle3_folder(path):
        draft = build_eagle3(path, config, site)
    else:
        model = load_model_config(path)
        proposer = build_neural_proposer(path, engine.dtype, replace(site, vocab_size=model.vocab_size))
        draft = ServiceDraft(proposer, model.vocab_size, device=device, grammars=grammar_compiler(path),
                             max_model_len=model.max_position_embeddings)
    ssd = ssd_speculator(draft.proposer, config.ssd, config.ngram_max)
    log.info("SSD ready", fan_out_budget=config.ssd.fan_out_budget, fit_fan_out=config.ssd.fit_fan_out,
             fan_out=config.ssd.fan_out, backup=config.ssd.backup, saguaro_c=config.ssd.saguaro_c)
    return replace(draft, ssd=ssd)


def grammar_compiler(folder: Path) -> GrammarCompiler | None:
    """Grammars over the tokenizer in `folder` (None without a tokenizer.json: drafts then ignore grammars)."""
    if not (folder / "tokenizer.json").is_file():
        log.info("no tokenizer.json beside the draft; structured-output requests are drafted without their grammar",
                 folder=str(folder))
        return None
    model = load_model_config(folder)
    return GrammarCompiler(folder / "tokenizer.json", model.vocab_size,
                           eos_token_ids(model.eos_token_ids, load_tokenizer(folder)))


def build_eagle3(path: Path, config: DraftServiceConfig, site: DraftSite) -> ServiceDraft:
    """An EAGLE-3 head over the target named by `config.target_model` (its embedding and config)."""
    if not config.target_model:
        raise InvalidRequestError(
            f"{path} is an EAGLE-3 head: it drafts from its target's features and embedding, so the draft "
            "service needs the target checkpoint too: pass --target-model (or SSD_DRAFT_TARGET_MODEL)")
    target = ensure_model(config.target_model)
    target_config = load_model_config(target)
    embedding = load_target_embedding(target)  # [V, d]
    if embedding.shape != (target_config.vocab_size, target_config.hidden_size):
        raise CheckpointError(f"{target}: {EMBEDDING_KEY} is {tuple(embedding.shape)}, its config says "
                              f"{(target_config.vocab_size, target_config.hidden_size)}")
    site = replace(site, vocab_size=target_config.vocab_size, target_config=target_config,
                   target_embedding=lambda: embedding)
    proposer = build_neural_proposer(path, config.engine.dtype, site)
    log.info("EAGLE-3 head loaded", head=str(path), target=str(target), feature_layers=proposer.feature_layers)
    width = len(proposer.feature_layers) * target_config.hidden_size  # concatenated target layers
    return ServiceDraft(proposer, target_config.vocab_size, width, device=site.device,
                        grammars=grammar_compiler(target),  # a head drafts in its target's vocabulary
                        max_model_len=target_config.max_position_embeddings)


def load_target_embedding(folder: Path) -> torch.Tensor:
    """Read only the input embedding [V, d] of a target checkpoint (the rest of the weights stay on disk)."""
    for file in checkpoint_files(folder):
        with safe_open(str(file), framework="pt") as f:
            if EMBEDDING_KEY in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                return f.get_tensor(EMBEDDING_KEY)
    raise CheckpointError(f"target checkpoint {folder} has no {EMBEDDING_KEY}; is it a Llama / Qwen3 model?")
