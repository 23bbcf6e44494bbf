"""A sequence's target features on their way to the proposer: the one merge routine for EAGLE-3 features.

Both sides keep one per sequence: the engine (ssd/engine/speculative_decoder.py) between the forward that computed the
features and the next propose, and the draft's record of the sequence (ssd/speculation/draft_record.py) between
the message that carried them and the next propose. Rows of later positions overwrite those of dropped tokens; a gap after the covered
positions is never filled (the proposer needs every position's features, in order).
"""

from dataclasses import dataclass

import torch


@dataclass
class FeatureLog:
    end: int = 0  # positions 0..end-1 have had target features, without a gap
    pending: tuple[int, torch.Tensor] | None = None  # (first position, [n, F]) not yet handed to the proposer

    def add(self, start: int, features: torch.Tensor) -> bool:
        """Features [n, F] of positions start..; False (nothing kept) if positions end..start-1 are missing."""
        if start > self.end:
            return False
        if self.pending is not None and self.pending[0] <= start:  # merge: the pending rows up to `start` stay
            first, old = self.pending
            features, start = torch.cat([old[: start - first], features]), first
        self.pending = (start, features)
        self.end = start + len(features)
        return True

    def truncate(self, num_positions: int) -> None:
        """Tokens past `num_positions` were dropped: their features no longer count."""
        self.end = min(self.end, num_positions)

    def take(self) -> tuple[int, torch.Tensor | None]:
        """(first position, [n, F]) of the features not handed on yet, or (0, None); they are handed on now."""
        start, features = self.pending if self.pending is not None else (0, None)
        self.pending = None
        return start, features
