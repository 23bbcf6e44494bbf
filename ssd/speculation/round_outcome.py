"""What one round committed for one sequence, as the verifier counted it: handed to the proposer by `observe`.

Made once per round per live sequence (ssd/engine/speculative_decoder.py), never re-derived: the target service copies it
onto the draft session's Outcome message. Proposers roll back by its length; SSD keys its cache on (k, bonus).
"""

from dataclasses import dataclass

NO_SPECULATION = -1  # num_accepted when no speculation of the proposer's was verified (a prefill, a plain step)


@dataclass(frozen=True)
class RoundOutcome:
    seq_id: int
    num_committed_before: int  # committed tokens before the round (the proposer's speculation followed them)
    new_tokens: list[int]  # committed in the round: the accepted draft tokens, then the bonus token (or one plain)
    num_accepted: int = NO_SPECULATION  # accepted speculation tokens, grammar splices included
    num_own_accepted: int | None = None  # of those, the leading ones the proposer drafted (a splice ends them)

    @property
    def bonus_token(self) -> int:
        return self.new_tokens[-1]

    @property
    def own_accepted(self) -> int:
        own = self.num_accepted if self.num_own_accepted is None else min(self.num_own_accepted, self.num_accepted)
        return max(own, 0)

    @property
    def valid_length(self) -> int:
        """Leading committed tokens whose draft state (KV) is still right (the bonus never has any yet)."""
        return self.num_committed_before + self.own_accepted

    @property
    def is_own_speculation(self) -> bool:
        """Whether the proposer's speculation was verified unchanged up to where it stopped (SSD: a cache key)."""
        return self.num_accepted >= 0 and self.own_accepted == self.num_accepted

    @staticmethod
    def plain(seq_id: int, num_committed_before: int, new_tokens: list[int]) -> "RoundOutcome":
        return RoundOutcome(seq_id, num_committed_before, list(new_tokens))
