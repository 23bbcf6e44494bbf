"""Reads a checkpoint folder's tokenizer files for TargetInfo, so the gateway needs no model files."""

import json
from pathlib import Path

from protos.ssd.v1 import target_pb2


def _token_text(value: object) -> str:
    if isinstance(value, dict):  # {"content": "<|im_end|>", ...} in older tokenizer configs
        return str(value.get("content", ""))
    return str(value or "")


def read_tokenizer_files(folder: Path) -> target_pb2.TokenizerFiles:
    """Empty for a weights-only checkpoint (the gateway then accepts token-id prompts only)."""
    folder = Path(folder)
    files = target_pb2.TokenizerFiles()
    if (folder / "tokenizer.json").is_file():
        files.tokenizer_json = (folder / "tokenizer.json").read_bytes()
    config = {}
    if (folder / "tokenizer_config.json").is_file():
        config = json.loads((folder / "tokenizer_config.json").read_text())
    if (folder / "chat_template.jinja").is_file():
        files.chat_template = (folder / "chat_template.jinja").read_text()
    elif isinstance(config.get("chat_template"), str):
        files.chat_template = config["chat_template"]
    files.bos_token = _token_text(config.get("bos_token"))
    files.eos_token = _token_text(config.get("eos_token"))
    return files
