"""Bad speculation settings fail early with clear errors."""

import pytest

from ssd.config import ProposerChoice, SpeculationConfig, TreeShape
from ssd.errors import InvalidRequestError
from ssd.llm import LLM
from tests.tiny_models import write_tiny_checkpoint


@pytest.mark.parametrize("k", [-1, 1000, 2.5])
def test_bad_lookahead(k):
    with pytest.raises(InvalidRequestError, match="lookahead K"):
        SpeculationConfig(ProposerChoice("ngram"), num_speculative_tokens=k)


@pytest.mark.parametrize("kwargs", [dict(budget=0), dict(depth=0), dict(top_k=0), dict(budget=129)])
def test_bad_tree(kwargs):
    with pytest.raises(InvalidRequestError, match="tree"):
        TreeShape(**kwargs)


def test_draft_with_other_vocabulary_is_refused(tiny_llama, tmp_path):
    write_tiny_checkpoint(tmp_path, "llama", vocab_size=80)
    spec = SpeculationConfig(ProposerChoice(str(tmp_path)))
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        LLM(str(tiny_llama), dtype="float32", kv_cache_memory_mb=4, speculation=spec)


def test_k_schedule_turns_speculation_off_at_large_batch():
    spec = SpeculationConfig(ProposerChoice("ngram"), num_speculative_tokens=6)
    assert [spec.lookahead_for(b) for b in (1, 4, 5, 16, 17)] == [6, 6, 3, 3, 0]
