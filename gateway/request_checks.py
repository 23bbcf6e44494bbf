"""Checks of a request's final sampling params and prompt, shared by the gRPC API and the HTTP bridge.

The HTTP schema refuses most bad values already (with OpenAI's field names); these checks make the gRPC API
refuse the same (INVALID_ARGUMENT), and check what only the served model knows (its vocabulary). A value the
target would choke on never leaves the gateway.
"""

import math
from collections.abc import Iterable

from gateway.errors import InvalidRequest
from protos.ssd.v1 import common_pb2

MAX_TOP_LOGPROBS = 20  # as in the OpenAI API (and the engine's limit)
CHARS_PER_TOKEN = 16  # the default prompt-character limit is this many per allowed prompt token

# field -> (low, high, is the low end open): floats, finite and in range
_FLOAT_RANGES = {
    "temperature": (0.0, 2.0, False), "top_p": (0.0, 1.0, False), "min_p": (0.0, 1.0, False),
    "presence_penalty": (-2.0, 2.0, False), "frequency_penalty": (-2.0, 2.0, False),
    "repetition_penalty": (0.0, 10.0, False),  # 0 on the wire means 1
}


def _in_range(value: float, low: float, high: float, is_open_low: bool) -> bool:
    return math.isfinite(value) and (value > low if is_open_low else value >= low) and value <= high


def check_token_ids(ids: Iterable[int], vocab_size: int, param: str) -> None:
    """Every id in [0, vocab_size) (vocab_size 0: the model is not known yet, only >= 0)."""
    for t in ids:
        if t < 0 or (vocab_size and t >= vocab_size):
            bound = f"in [0, {vocab_size}) (the vocabulary)" if vocab_size else "non-negative"
            raise InvalidRequest(f"{param}: token ids must be {bound}, got {t}", param=param)


def check_params(params: common_pb2.SamplingParams, vocab_size: int) -> None:
    """InvalidRequest naming the first field out of range."""
    for name, (low, high, is_open_low) in _FLOAT_RANGES.items():
        value = getattr(params, name)
        if not _in_range(value, low, high, is_open_low):
            raise InvalidRequest(f"{name} must be in [{low:g}, {high:g}], got {value}", param=name)
    for name in ("top_k", "max_tokens", "min_tokens"):
        if getattr(params, name) < 0:
            raise InvalidRequest(f"{name} must be >= 0, got {getattr(params, name)}", param=name)
    for name in ("logprobs", "prompt_logprobs"):
        if params.HasField(name) and not 0 <= getattr(params, name) <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"{name} must be in [0, {MAX_TOP_LOGPROBS}], got {getattr(params, name)}",
                                 param=name)
    check_token_ids(params.stop_token_ids, vocab_size, "stop_token_ids")
    check_token_ids(params.logit_bias.keys(), vocab_size, "logit_bias")
    for token_id, bias in params.logit_bias.items():
        if not _in_range(bias, -100.0, 100.0, False):
            raise InvalidRequest(f"logit_bias values must be in [-100, 100], got {bias} for token {token_id}",
                                 param="logit_bias")


def text_size(value: object) -> tuple[int, int]:
    """Characters and UTF-8 bytes of every string value in a JSON-like value (keys are bounded by the body
    size limit); iterative."""
    num_chars = num_bytes = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            num_chars += len(item)
            num_bytes += len(item.encode("utf-8", "surrogatepass"))
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return num_chars, num_bytes


def check_prompt_size(parts: object, max_chars: int, max_bytes: int, param: str) -> None:
    """Refuse a prompt whose text is past the limits, before any work is spent on it (the tokenizer's
    and the chat template's cost grows with it)."""
    num_chars, num_bytes = text_size(parts)
    if num_chars > max_chars:
        raise InvalidRequest(f"the prompt has {num_chars} characters; at most {max_chars} are allowed", param=param)
    if num_bytes > max_bytes:
        raise InvalidRequest(f"the prompt has {num_bytes} bytes (UTF-8); at most {max_bytes} are allowed",
                             param=param)
