"""The vocabulary a drafter's logits come in, and the way from it to target ids.

An EAGLE-3 head drafts over a trimmed vocabulary (Vd rows of its lm_head, e.g. 8,192 of 49,152). SSD's branch
logic ranks, samples and Saguaro-scales in that vocabulary and maps only the chosen tokens to target ids; a
q row is widened to the target vocabulary only when a cached speculation is handed to the verifier. A draft
model's is the identity unless its LM head is trimmed too (a `d2t` map in its folder: ssd/loader/draft_checkpoint.py).
"""

import torch


class DraftVocab:
    def __init__(self, target_size: int, target_ids: torch.Tensor | None = None) -> None:
        """`target_ids` [Vd] int64 on CPU: the target id of each draft id; None = the target vocabulary itself."""
        self.target_size = target_size
        self.target_ids = target_ids

    def to_target(self, draft_ids: list[int]) -> list[int]:
        """Draft ids -> target ids."""
        if self.target_ids is None:
            return list(draft_ids)
        return self.target_ids[torch.tensor(draft_ids, dtype=torch.long)].tolist()

    def widen(self, rows: torch.Tensor, fill: float) -> torch.Tensor:
        """rows [n, Vd] -> [n, V] float32 on the rows' device, `fill` where the draft cannot go (-inf for logits,
        0 for q); rows already in the target vocabulary come back as they are."""
        if self.target_ids is None:
            return rows.float()
        full = torch.full((rows.shape[0], self.target_size), fill, device=rows.device)
        full[:, self.target_ids.to(rows.device)] = rows.float()
        return full


def target_vocab(size: int) -> DraftVocab:
    """The identity vocabulary of `size` target tokens."""
    return DraftVocab(size)
