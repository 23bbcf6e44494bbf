"""The target features already sent for each live sequence, so it can be prefilled whole on another draft.

An EAGLE-3 draft drafts a sequence only when it holds the target features of every committed position. The
engine hands the proposer each position's features once; a sequence that moves to another draft (its draft
died), whose session reopens, or whose draft lacks the prefix blocks the target's prefix cache served
(FAILED_PRECONDITION) would arrive there without the old ones and get no speculation. The RemoteProposer keeps
them here and sends them all with the sequence's Prefill. Cost: F values per
committed position per live sequence (the default model: 3 x 576 bfloat16 = 3.4 KB), on the target's device.
"""

import structlog
import torch

log = structlog.get_logger(__name__)


class SentFeatures:
    """Per sequence: a buffer [capacity, F] whose first `length` rows are positions 0..length-1 (grown by
    doubling, so appending a round's rows copies nothing old)."""

    def __init__(self) -> None:
        self._rows: dict[int, tuple[torch.Tensor, int]] = {}  # seq id -> (buffer [capacity, F], length)

    def add(self, seq_id: int, start: int, features: torch.Tensor) -> None:
        """Positions start.. get `features` [n, F] (later rounds overwrite rows of dropped tokens). A gap after
        what is held (features this log never saw) leaves the sequence out: it cannot be replayed whole."""
        buffer, length = self._rows.get(seq_id, (None, 0))
        if start > length:
            if self._rows.pop(seq_id, None) is not None:
                log.debug("target features with a gap; the sequence cannot be replayed", seq_id=seq_id,
                          start=start, num_held=length)
            return
        end = start + len(features)
        if (buffer is None or end > len(buffer) or buffer.dtype != features.dtype
                or buffer.device != features.device):
            grown = torch.empty(max(2 * end, 16), features.shape[1], dtype=features.dtype, device=features.device)
            if buffer is not None and start > 0:
                grown[:start] = buffer[:start].to(features.device, features.dtype)
            buffer = grown
        buffer[start:end] = features
        self._rows[seq_id] = (buffer, end)

    def replay(self, seq_id: int) -> torch.Tensor | None:
        """-> [length, F]: the features of positions 0.. held for the sequence (a view), or None."""
        held = self._rows.get(seq_id)
        return None if held is None else held[0][: held[1]]

    def release(self, seq_id: int) -> None:
        self._rows.pop(seq_id, None)

    def __len__(self) -> int:
        return len(self._rows)
