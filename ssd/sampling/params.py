"""Per-request sampling parameters, validated on construction (bad values raise InvalidRequestError)."""

import math
from dataclasses import dataclass, field

from ssd.config import DecodeMode, parse_enum
from ssd.errors import InvalidRequestError
from ssd.sampling.grammar import Grammar
from ssd.sampling.logprobs import MAX_TOP_LOGPROBS


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # 0 = no top-k limit
    max_tokens: int = 64  # generated tokens at most
    seed: int | None = None  # same seed, same output
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)  # finish when one is generated
    ignore_eos: bool = False  # keep generating past the model's EOS tokens
    draft_temperature: float | None = None  # speculation: the draft's sampling temperature; None = temperature
    # None: as the engine's config says. AR: plain decoding even when the engine speculates. SD / SSD: speculate,
    # asking a remote draft for that mode (in one process the engine's config decides between the two).
    mode: DecodeMode | None = None
    adaptive: bool = False  # speculate only in batches where the engine measured it faster (ssd/engine/mode_choice.py)
    logprobs: int | None = None  # report each token's log-probability and this many top alternatives; None = off
    prompt_logprobs: int | None = None  # the same for every prompt token after the first (scored at prefill)
    presence_penalty: float = 0.0  # subtracted once from the logit of every token already generated, in [-2, 2]
    frequency_penalty: float = 0.0  # subtracted per occurrence of a token already generated, in [-2, 2]
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]) pairs (or a dict) added to logits
    repetition_penalty: float = 1.0  # > 0; tokens in the prompt or answer: logit / penalty if > 0, else * penalty
    min_p: float = 0.0  # in [0, 1]: drop tokens less likely than min_p x the most likely one (after temperature)
    min_tokens: int = 0  # EOS and the stop token ids cannot end the answer before it holds this many tokens
    grammar: Grammar | None = None  # structured output: the answer follows this JSON schema or regex, then EOS

    @property
    def is_speculative(self) -> bool:
        """Whether this request takes part in speculation rounds (when the engine speculates at all)."""
        return self.mode is not DecodeMode.AR

    def __post_init__(self) -> None:
        if self.mode is not None:
            object.__setattr__(self, "mode", parse_enum(DecodeMode, self.mode, "mode"))
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float):
            raise InvalidRequestError(f"temperature must be a number, got {self.temperature!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if not isinstance(self.top_p, int | float) or not (0 < self.top_p <= 1):
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.draft_temperature is not None and not (
            isinstance(self.draft_temperature, int | float) and math.isfinite(self.draft_temperature)
            and self.draft_temperature >= 0
        ):
            raise InvalidRequestError(f"draft_temperature must be >= 0, got {self.draft_temperature!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise InvalidRequestError(f"seed must be an integer, got {self.seed!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value <= MAX_TOP_LOGPROBS):
                raise InvalidRequestError(f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}], got {value!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not -2 <= value <= 2:
                raise InvalidRequestError(f"{name} must be a number in [-2, 2], got {value!r}")
        if (isinstance(self.repetition_penalty, bool) or not isinstance(self.repetition_penalty, int | float)
                or not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0)):
            raise InvalidRequestError(f"repetition_penalty must be a number > 0, got {self.repetition_penalty!r}")
        if isinstance(self.min_p, bool) or not isinstance(self.min_p, int | float) or not 0 <= self.min_p <= 1:
            raise InvalidRequestError(f"min_p must be a number in [0, 1], got {self.min_p!r}")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or not (
                0 <= self.min_tokens <= self.max_tokens):
            raise InvalidRequestError(f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], "
                                      f"got {self.min_tokens!r}")
        self._check_grammar()
        object.__setattr__(self, "logit_bias", _checked_bias(self.logit_bias))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    def _check_grammar(self) -> None:
        if self.grammar is None:
            return
        if not isinstance(self.grammar, Grammar):
            raise InvalidRequestError(f"grammar must be a Grammar, got {type(self.grammar).__name__}")
        if self.ignore_eos:  # a complete answer allows only EOS: it would be forced to go on past it
            raise InvalidRequestError("ignore_eos cannot be combined with a grammar (a complete answer ends with EOS)")
        if self.min_tokens:  # a short complete answer would leave no token allowed
            raise InvalidRequestError("min_tokens cannot be combined with a grammar (the grammar decides the length)")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def _checked_bias(bias: object) -> tuple[tuple[int, float], ...]:
    """(token id, bias) pairs from a dict or pairs; ids >= 0 (the engine checks the vocabulary), biases in
    [-100, 100] as in the OpenAI API."""
    pairs = list(bias.items()) if isinstance(bias, dict) else list(bias)  # type: ignore[call-overload]
    out = []
    for pair in pairs:
        token, value = pair
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise InvalidRequestError(f"logit_bias keys must be token ids >= 0, got {token!r}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
            raise InvalidRequestError(f"logit_bias values must be numbers in [-100, 100], got {value!r}")
        out.append((token, float(value)))
    return tuple(out)
