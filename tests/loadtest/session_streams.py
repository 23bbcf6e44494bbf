"""Generated Speculator.Session streams for the load tests: Hello, a Prefill round, rounds of outcomes that
commit one token each, and the Release (what a target sends, without features: an n-gram draft needs none)."""

import json
from pathlib import Path

VOCAB_SIZE = 49152


def session_stream(seq_id: int, prompt: list[int], num_rounds: int, k: int = 3) -> list[dict]:
    tokens = list(prompt)
    messages = [{"round_id": 1, "hello": {"target_id": "loadtest", "vocab_size": VOCAB_SIZE,
                                          "transports": ["TENSOR_TRANSPORT_INLINE"]}},
                {"round_id": 2, "round": {"prefills": [{"seq_id": seq_id, "token_ids": tokens}],
                                          "num_speculative_tokens": k}}]
    for i in range(num_rounds):
        bonus = prompt[i % len(prompt)]
        messages.append({"round_id": 3 + i, "round": {"outcomes": [{
            "seq_id": seq_id, "num_committed_before": len(tokens), "new_token_ids": [bonus], "num_accepted": 0,
            "bonus_token": bonus}], "num_speculative_tokens": k}})
        tokens.append(bonus)
    messages.append({"release": {"seq_ids": [seq_id]}})
    return messages


def write_streams(path: Path, streams: list[list[dict]]) -> Path:
    path.write_text("".join(json.dumps(stream) + "\n" for stream in streams))
    return path
