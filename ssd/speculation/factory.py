"""The one proposer factory: n-gram lookup, a draft model or an EAGLE-3 head, optionally under SSD.

The engine builds from its SpeculationConfig and target worker (`build_proposer`); the draft service builds the
same proposers from a `DraftSite` it fills from its flags (`build_neural_proposer`, `ssd_speculator`).
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ssd.config import SpeculationConfig, SsdConfig
from ssd.errors import InvalidRequestError
from ssd.model_config import ModelConfig
from ssd.model_store import resolve_model
from ssd.runtime.model_worker import ModelWorker
from ssd.speculation.branch_drafter import BranchDrafter
from ssd.speculation.draft_model import DraftModelProposer
from ssd.speculation.ngram import NgramProposer
from ssd.speculation.paged_branches import PagedBranchDrafter
from ssd.speculation.proposer import Proposer
from ssd.speculation.speculator_worker import OverlappedSpeculator
from ssd.speculation.ssd_speculator import SsdSpeculator


@dataclass(frozen=True)
class DraftSite:
    """Where a neural draft runs and what it takes of its target (the engine's worker, or the draft service's
    --target-model)."""

    device: torch.device
    vocab_size: int  # the target's vocabulary: a draft model's q is widened to it
    block_size: int  # the target's KV block size (an EAGLE-3 head's prefix cache keys by the target's blocks)
    target_config: ModelConfig | None = None  # EAGLE-3: the target's architecture; None = no head can be built
    target_embedding: Callable[[], torch.Tensor] | None = None  # EAGLE-3: reads the target's input embedding [V, d]
    prefix_cache_blocks: int = 1024  # EAGLE-3 head blocks kept (0 = no prefix cache)
    kv_cache_memory_mb: int = 256  # a draft model's KV budget
    compile: str = "auto"  # a draft model's torch.compile setting (ssd/runtime/compile.py)
    enforce_eager: bool = False
    attention_backend: str = "auto"


def is_eagle3_folder(folder: Path) -> bool:
    config = folder / "config.json"
    if not config.is_file():
        return False
    raw = json.loads(config.read_text())
    return "draft_vocab_size" in raw or any("eagle" in a.lower() for a in raw.get("architectures") or [])


def build_neural_proposer(path: Path, dtype: str, site: DraftSite) -> Proposer:
    """The draft model or EAGLE-3 head in `path`, on `site`."""
    if not is_eagle3_folder(path):
        return DraftModelProposer(path, dtype, site.vocab_size, block_size=site.block_size,
                                  kv_cache_memory_mb=site.kv_cache_memory_mb, device=site.device,
                                  compile=site.compile, enforce_eager=site.enforce_eager,
                                  attention_backend=site.attention_backend)
    if site.target_config is None or site.target_embedding is None:
        raise InvalidRequestError(f"{path} is an EAGLE-3 head: it drafts from its target's features and embedding, "
                                  "so it needs the target checkpoint too")
    from ssd.speculation.eagle3_proposer import Eagle3Proposer

    return Eagle3Proposer(path, site.target_embedding(), site.target_config, dtype, device=site.device,
                          prefix_block_size=site.block_size, prefix_cache_blocks=site.prefix_cache_blocks)


def build_proposer(config: SpeculationConfig, target: ModelWorker, dtype: str) -> Proposer:
    """The proposer `config` names, on the target's device (n-gram lookup needs none)."""
    choice = config.proposer
    if choice.is_ngram:
        return NgramProposer(max_ngram=choice.ngram_max)
    blocks = target.block_manager  # the head's prefix cache keys by the target's blocks (and is on with its)
    site = DraftSite(target.device, target.model_config.vocab_size, blocks.block_size, target.model_config,
                     target.input_embedding, prefix_cache_blocks=1024 if blocks.enable_prefix_caching else 0)
    proposer = build_neural_proposer(resolve_model(choice.draft), choice.draft_dtype or dtype, site)
    return with_ssd(proposer, config) if config.ssd is not None else proposer


def branch_drafter_for(proposer: Proposer) -> BranchDrafter:
    """The SSD glue / tree-decode adapter of a neural proposer."""
    if isinstance(proposer, DraftModelProposer):
        return PagedBranchDrafter(proposer)
    from ssd.speculation.eagle3_proposer import Eagle3Proposer

    if isinstance(proposer, Eagle3Proposer):
        from ssd.speculation.eagle3_branches import Eagle3BranchDrafter

        return Eagle3BranchDrafter(proposer)
    raise InvalidRequestError(f"SSD needs a draft model or an EAGLE-3 head, not {type(proposer).__name__}")


def ssd_speculator(proposer: Proposer, config: SsdConfig, ngram_max: int) -> SsdSpeculator:
    """An SSD speculation cache over a neural proposer (n-gram lookup of `ngram_max` as its fast backup)."""
    return SsdSpeculator(proposer, branch_drafter_for(proposer), config, ngram_max)


def with_ssd(proposer: Proposer, config: SpeculationConfig) -> OverlappedSpeculator:
    """Wrap a neural proposer so it answers from an SSD speculation cache, built on a worker thread of its own
    while the caller verifies."""
    return OverlappedSpeculator(ssd_speculator(proposer, config.ssd or SsdConfig(), config.proposer.ngram_max))
