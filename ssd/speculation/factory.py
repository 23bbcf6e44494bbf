"""Builds the proposer a SpeculationConfig names: n-gram lookup, a draft model, or an EAGLE-3 head."""

import json
from pathlib import Path

from ssd.config import SpeculationConfig, SsdConfig
from ssd.errors import InvalidRequestError
from ssd.model_store import resolve_model
from ssd.runtime.model_worker import ModelWorker
from ssd.speculation.branch_drafter import BranchDrafter
from ssd.speculation.draft_model import DraftModelProposer
from ssd.speculation.ngram import NgramProposer
from ssd.speculation.paged_branches import PagedBranchDrafter
from ssd.speculation.proposer import Proposer
from ssd.speculation.speculator_worker import OverlappedSpeculator
from ssd.speculation.ssd_speculator import SsdSpeculator


def is_eagle3_folder(folder: Path) -> bool:
    config = folder / "config.json"
    if not config.is_file():
        return False
    raw = json.loads(config.read_text())
    return "draft_vocab_size" in raw or any("eagle" in a.lower() for a in raw.get("architectures") or [])


def build_proposer(config: SpeculationConfig, target: ModelWorker, dtype: str) -> Proposer:
    """The proposer `config` names, on the target's device (n-gram lookup needs none)."""
    choice = config.proposer
    if choice.is_ngram:
        return NgramProposer(max_ngram=choice.ngram_max)
    path = resolve_model(choice.draft)
    draft_dtype = choice.draft_dtype or dtype
    if is_eagle3_folder(path):
        from ssd.speculation.eagle3_proposer import Eagle3Proposer

        blocks = target.block_manager  # the head's prefix cache keys by the target's blocks (and is on with its)
        proposer: Proposer = Eagle3Proposer(path, target.input_embedding(), target.model_config,
                                            draft_dtype, device=target.device, prefix_block_size=blocks.block_size,
                                            prefix_cache_blocks=1024 if blocks.enable_prefix_caching else 0)
    else:
        proposer = DraftModelProposer(path, draft_dtype, target.model_config.vocab_size,
                                      block_size=target.block_manager.block_size, device=target.device)
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


def with_ssd(proposer: Proposer, config: SpeculationConfig) -> OverlappedSpeculator:
    """Wrap a neural proposer so it answers from an SSD speculation cache, built on a worker thread of its own
    while the caller verifies."""
    ssd = SsdSpeculator(proposer, branch_drafter_for(proposer), config.ssd or SsdConfig(),
                         config.proposer.ngram_max)
    return OverlappedSpeculator(ssd)
