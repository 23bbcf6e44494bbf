"""Builds the draft service's proposer from its config: n-gram lookup or a draft checkpoint."""

from draft_service.config import DraftServiceConfig
from ssd.errors import InvalidRequestError
from ssd.model_store import resolve_model
from ssd.spec.draft_model import DraftModelProposer
from ssd.spec.factory import is_eagle3_folder
from ssd.spec.ngram import NgramProposer
from ssd.spec.proposer import Proposer


def build_service_proposer(config: DraftServiceConfig) -> tuple[Proposer, int]:
    """The proposer and its vocabulary size (0 = any vocabulary, n-gram)."""
    if config.draft == "ngram":
        return NgramProposer(max_ngram=config.ngram_max), 0
    path = resolve_model(config.draft)
    if is_eagle3_folder(path):
        raise InvalidRequestError("EAGLE-3 heads need target features over the session; not served remotely yet")
    from ssd.model_config import load_model_config

    vocab = load_model_config(path).vocab_size
    return DraftModelProposer(path, config.dtype, vocab, block_size=config.block_size,
                              kv_cache_memory_mb=config.kv_cache_memory_mb), vocab
