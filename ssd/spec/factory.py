"""Builds the proposer a SpeculationConfig names: n-gram lookup, a draft model, or an EAGLE-3 head."""

import json
from pathlib import Path

from ssd.engine.model_worker import ModelWorker
from ssd.model_store import resolve_model
from ssd.spec.config import SpeculationConfig
from ssd.spec.draft_model import DraftModelProposer
from ssd.spec.ngram import NgramProposer
from ssd.spec.proposer import Proposer


def is_eagle3_folder(folder: Path) -> bool:
    config = folder / "config.json"
    if not config.is_file():
        return False
    raw = json.loads(config.read_text())
    return "draft_vocab_size" in raw or any("eagle" in a.lower() for a in raw.get("architectures") or [])


def build_proposer(config: SpeculationConfig, target: ModelWorker, dtype: str) -> Proposer:
    if config.draft == "ngram":
        return NgramProposer(max_ngram=config.ngram_max)
    path = resolve_model(config.draft)
    draft_dtype = config.draft_dtype or dtype
    if is_eagle3_folder(path):
        from ssd.spec.eagle3_proposer import Eagle3Proposer

        return Eagle3Proposer(path, target.model.model.embed_tokens.weight, target.model_config, draft_dtype)
    return DraftModelProposer(path, draft_dtype, target.model_config.vocab_size,
                              block_size=target.block_manager.block_size)
