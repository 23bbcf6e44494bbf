"""The prefix-cache flags of the model services: the target's --no-prefix-caching / --block-size, the draft's
--block-size / --prefix-cache-blocks (an EAGLE-3 head's own prefix cache)."""

import pytest

from draft_service.config import DraftServiceConfig
from draft_service.config import parse_args as draft_args
from ssd.errors import InvalidRequestError
from target_service.config import parse_args as target_args


def test_prefix_cache_flags_parse():
    assert target_args([]).engine.enable_prefix_caching and target_args([]).engine.block_size == 16
    off = target_args(["--no-prefix-caching", "--block-size", "4"])
    assert not off.engine.enable_prefix_caching and off.engine.block_size == 4
    draft = draft_args(["--block-size", "4", "--prefix-cache-blocks", "0"])
    assert (draft.engine.block_size, draft.prefix_cache_blocks) == (4, 0)
    assert draft_args([]).prefix_cache_blocks == 1024


def test_negative_prefix_cache_blocks_are_refused():
    with pytest.raises(InvalidRequestError, match="prefix cache blocks"):
        DraftServiceConfig(prefix_cache_blocks=-1)
