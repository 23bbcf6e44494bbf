"""What one round committed for one sequence, as the verifier counted it: handed to the proposer by `observe`.

The engine makes it once per round per live sequence (ssd/engine/spec_decode.py) and never re-derives it; the
target service copies it onto the draft session's Outcome message and the draft reads it from there. A proposer
rolls its model state back by length with it (`valid_length`); SSD keys its speculation cache on
(num_accepted, bonus_token).
"""

from dataclasses import dataclass

NO_SPECULATION = -1  # num_accepted when no speculation of the proposer's was verified (a prefill, a plain step)


@dataclass(frozen=True)
class RoundOutcome:
    seq_id: int
    num_committed_before: int  # committed tokens before the round (the proposer's speculation followed them)
    new_tokens: list[int]  # committed in the round: the accepted draft tokens, then the bonus token (or one plain)
    num_accepted: int = NO_SPECULATION  # accepted speculation tokens, grammar splices included
    # leading accepted tokens that are the proposer's own draft (a token the grammar spliced in ends them); None = all
    num_own_accepted: int | None = None

    @property
    def bonus_token(self) -> int:
        return self.new_tokens[-1]

    @property
    def num_committed(self) -> int:
        return self.num_committed_before + len(self.new_tokens)

    @property
    def own_accepted(self) -> int:
        """Accepted tokens the proposer drafted itself (0 without a verified speculation)."""
        if self.num_accepted < 0:
            return 0
        return self.num_accepted if self.num_own_accepted is None else min(self.num_own_accepted, self.num_accepted)

    @property
    def valid_length(self) -> int:
        """Leading committed tokens whose draft state (KV) is still right: those before the round, then the accepted
        tokens the proposer drafted itself (the bonus token never has draft state yet)."""
        return self.num_committed_before + self.own_accepted

    @property
    def is_own_speculation(self) -> bool:
        """Whether the round verified the proposer's speculation unchanged up to where it stopped (SSD's cache key
        (num_accepted, bonus_token) then names a branch the draft built)."""
        return self.num_accepted >= 0 and self.own_accepted == self.num_accepted

    @staticmethod
    def plain(seq_id: int, num_committed_before: int, new_tokens: list[int]) -> "RoundOutcome":
        """A round that verified no speculation (a prefill's first token, a plain decode step)."""
        return RoundOutcome(seq_id, num_committed_before, list(new_tokens))
