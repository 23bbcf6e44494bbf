"""What a Speculator.Session peer may ask of the draft: checked at the boundary, before any model work.

The draft trusts no target. A round whose sizes are past these limits (lookahead K, tree shape, fan-out,
sequences per round) is refused as a whole: InvalidRequestError, INVALID_ARGUMENT on the stream, and the
session ends (the target reopens one). A sequence whose own tokens or features are bad (ids outside the
vocabulary, longer than the model, feature rows past its tokens) is refused alone in the round's errors and
forgotten; the round's other sequences are answered.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from protos.ssd.v1 import common_pb2, draft_pb2
from ssd.config import MAX_LOOKAHEAD, MAX_TREE_BUDGET
from ssd.errors import InvalidRequestError


@dataclass(frozen=True)
class SessionLimits:
    max_speculative_tokens: int = MAX_LOOKAHEAD  # lookahead K per round (a tree's depth)
    max_tree_budget: int = MAX_TREE_BUDGET  # draft nodes per token tree
    max_tree_top_k: int = 8  # children tried per expanded tree node
    max_fan_out_budget: int = 64  # SSD bonus-token guesses per sequence and round
    max_sequences: int = 256  # sequences one session holds (and one round names) at most
    max_model_len: int = 8192  # committed tokens per sequence (the draft model's positions)
    max_round_tokens: int = 1 << 18  # new tokens (prefills + outcomes) one round carries: bounds one round's work

    def __post_init__(self) -> None:
        values = (self.max_speculative_tokens, self.max_tree_budget, self.max_tree_top_k, self.max_fan_out_budget,
                  self.max_sequences, self.max_model_len, self.max_round_tokens)
        if min(values) < 1:
            raise InvalidRequestError(f"session limits must be >= 1, got {self}")


def check_round(round_: draft_pb2.Round, limits: SessionLimits) -> None:
    """Round-level sizes; raises InvalidRequestError (the session ends) for any past its limit."""
    k = round_.num_speculative_tokens
    if not 0 <= k <= limits.max_speculative_tokens:
        raise InvalidRequestError(f"num_speculative_tokens must be in [0, {limits.max_speculative_tokens}], got {k}")
    if round_.HasField("tree"):
        t = round_.tree
        if not (1 <= t.budget <= limits.max_tree_budget and 1 <= t.depth <= limits.max_speculative_tokens
                and 1 <= t.top_k <= limits.max_tree_top_k):
            raise InvalidRequestError(
                f"tree shape must have budget in [1, {limits.max_tree_budget}], depth in "
                f"[1, {limits.max_speculative_tokens}] and top_k in [1, {limits.max_tree_top_k}], got "
                f"budget={t.budget} depth={t.depth} top_k={t.top_k}")
    check_ssd_options(round_.ssd, limits)
    named = len(round_.prefills) + len(round_.outcomes)
    if named > limits.max_sequences:
        raise InvalidRequestError(f"a session holds at most {limits.max_sequences} sequences; this round names {named}")
    tokens = sum(len(p.token_ids) for p in round_.prefills) + sum(len(o.new_token_ids) for o in round_.outcomes)
    if tokens > limits.max_round_tokens:
        raise InvalidRequestError(f"a round carries at most {limits.max_round_tokens} new tokens, this one {tokens}")


def check_ssd_options(options: draft_pb2.SsdOptions, limits: SessionLimits) -> None:
    """The fan-out budget of a Hello's (or an older target's Round's) SSD options; InvalidRequestError past it."""
    budget = options.fan_out_budget
    if not 0 <= budget <= limits.max_fan_out_budget:
        raise InvalidRequestError(f"ssd.fan_out_budget must be in [0, {limits.max_fan_out_budget}], got {budget}")


MAX_TEMPERATURE = 100.0  # a draft temperature past it is a malformed Prefill


def check_prefill_fields(token_ids: Sequence[int], temperature: float, vocab_size: int,
                         limits: SessionLimits) -> None:
    """A Prefill's own fields: its tokens (see check_tokens) and its draft temperature in [0, MAX_TEMPERATURE]
    (NaN refused). Raises InvalidRequestError (the sequence is refused)."""
    check_tokens(token_ids, vocab_size, limits, len(token_ids))
    if not 0.0 <= temperature <= MAX_TEMPERATURE:  # also refuses NaN
        raise InvalidRequestError(f"temperature must be in [0, {MAX_TEMPERATURE}], got {temperature}")


def check_tokens(token_ids: Sequence[int], vocab_size: int, limits: SessionLimits, total_len: int) -> None:
    """A sequence's new tokens: ids in [0, vocab_size) (any id >= 0 when vocab_size is 0) and the sequence's
    `total_len` within the model's length. Raises InvalidRequestError (the sequence is refused)."""
    if total_len > limits.max_model_len:
        raise InvalidRequestError(f"the sequence would hold {total_len} tokens, past the draft's "
                                  f"max_model_len {limits.max_model_len}")
    if not token_ids:
        return
    low, high = min(token_ids), max(token_ids)
    if low < 0 or (vocab_size and high >= vocab_size):
        bad = low if low < 0 else high
        raise InvalidRequestError(f"token id {bad} is outside the vocabulary [0, {vocab_size or 'any'})")


def check_feature_rows(num_rows: int, start: int, num_tokens: int) -> None:
    """Features of positions start..start+num_rows-1 must lie within the sequence's `num_tokens` positions."""
    if start < 0 or start + num_rows > num_tokens:
        raise InvalidRequestError(f"features of positions [{start}, {start + num_rows}) are past the sequence's "
                                  f"{num_tokens} tokens")


def check_feature_tensor(tensor: common_pb2.Tensor, width: int) -> None:
    """A target-features tensor's metadata: [n, width] float32 or bfloat16, and inline bytes = n x width x itemsize.
    (Whether a shared-memory handle opens is known only when it is read.)"""
    if tensor.dtype not in ("float32", "bfloat16") or len(tensor.shape) != 2 or tensor.shape[1] != width:
        raise InvalidRequestError(f"target features must be [n, {width}] float32 or bfloat16, "
                                  f"got {list(tensor.shape)} {tensor.dtype}")
    if tensor.WhichOneof("data") == "inline_bytes":
        expected = tensor.shape[0] * width * (4 if tensor.dtype == "float32" else 2)
        if len(tensor.inline_bytes) != expected:
            raise InvalidRequestError(f"target features {list(tensor.shape)} {tensor.dtype} need {expected} bytes, "
                                      f"got {len(tensor.inline_bytes)}")
