"""Tiny Llamas over a 16-token letter tokenizer, for structured-output tests: a grammar over letters is easy to
read and its every answer can be enumerated."""

import json
from pathlib import Path

import torch

from tests.tiny_models import write_tiny_checkpoint

LETTERS = "abcdefghijklmn"  # token i + 2 is LETTERS[i]; 0 = <s>, 1 = </s> (EOS)
EOS = 1


def write_letter_tokenizer(folder: Path) -> None:
    """A 16-token byte-level tokenizer: one token per letter, no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<s>": 0, "</s>": 1, **{ch: i + 2 for i, ch in enumerate(LETTERS)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}))


def write_letter_models(target: Path, draft: Path) -> torch.nn.Module:
    """A target and a one-layer draft with the letter tokenizer; returns the target's HF model in float64."""
    hf = write_tiny_checkpoint(target, "llama", seed=0, vocab_size=16, initializer_range=0.3)
    write_tiny_checkpoint(draft, "llama", seed=5, vocab_size=16, num_hidden_layers=1, initializer_range=0.3)
    for folder in (target, draft):
        write_letter_tokenizer(folder)
    return hf.double()
