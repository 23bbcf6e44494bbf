"""A Prefill's shared prefix on the draft: start the sequence from the head's own prefix cache, or refuse it.

The target sends `num_cached_tokens` = N when its prefix cache served the prompt's first N tokens, and target
features from position N - 1 only. The head then needs its own KV of head positions 0..N-2, which its
HeadPrefixCache keeps under the same chained block hashes (ssd/speculation/head_prefix_cache.py). When it does
not hold them all (a restarted draft, evicted blocks, another draft of a pool, a different block size), the
sequence is refused with PrefixUnavailableError (FAILED_PRECONDITION on the wire) and nothing is kept: the
target resends it with N = 0 and every feature, so the draft's output never depends on what it cached.
"""

from protos.ssd.v1 import draft_pb2
from ssd.errors import InvalidRequestError, PrefixUnavailableError


def restore_prefix(proposer: object, internal_id: int, p: draft_pb2.Prefill) -> int:
    """Start the proposer's sequence `internal_id` from its cached head blocks; -> positions 0.. now covered
    (N - 1: the Prefill's features start there). Raises PrefixUnavailableError if the draft lacks them."""
    n = p.num_cached_tokens
    if not 0 < n < len(p.token_ids):
        raise InvalidRequestError(f"sequence {p.seq_id}: num_cached_tokens {n} must be in [0, "
                                  f"{len(p.token_ids) - 1}] (the last token is never served from a prefix cache)")
    need = n - 1  # head positions 0..n-2 depend on tokens 0..n-1 only
    if need == 0:
        return 0
    restore = getattr(proposer, "restore_prefix", None)
    found = restore(internal_id, list(p.token_ids), need) if restore is not None else 0
    if found < need:
        raise PrefixUnavailableError(
            f"sequence {p.seq_id}: the draft's prefix cache holds {found} of the {need} leading head positions of the "
            f"{n} prompt tokens the target's prefix cache served; resend the Prefill with num_cached_tokens = 0 and "
            "every target feature")
    return need
