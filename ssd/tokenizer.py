"""Tokenizer of a checkpoint folder: encode, decode, chat template, incremental detokenization."""

from pathlib import Path
from typing import Any

from ssd.errors import CheckpointError, InvalidRequestError


class Tokenizer:
    def __init__(self, folder: Path) -> None:
        from transformers import AutoTokenizer  # heavy; imported when a tokenizer is built

        try:
            self._tok = AutoTokenizer.from_pretrained(str(folder))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{folder} has no usable tokenizer: {e}") from e

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    @property
    def eos_token_id(self) -> int | None:
        return self._tok.eos_token_id

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._tok, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        if not self.has_chat_template:
            raise InvalidRequestError("this model has no chat template; send a plain prompt instead")
        return self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def eos_token_ids(model_eos: list[int], tokenizer: Tokenizer | None) -> frozenset[int]:
    """The ids that end an answer: the checkpoint config's EOS ids plus the tokenizer's."""
    eos = set(model_eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    return frozenset(eos)


def load_tokenizer(folder: Path) -> Tokenizer | None:
    """The folder's tokenizer, or None for a weights-only checkpoint (token-id prompts only)."""
    if not any((Path(folder) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None
    return Tokenizer(folder)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas that never split a UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.text = ""

    def push(self, new_ids: list[int]) -> str:
        self.token_ids.extend(new_ids)
        full = self.tokenizer.decode(self.token_ids)
        if full.endswith("\ufffd"):
            return ""  # an incomplete multi-byte character: wait for the next token
        delta, self.text = full[len(self.text) :], full
        return delta
