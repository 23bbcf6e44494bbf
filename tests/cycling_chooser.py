"""A mode chooser for tests that switches every step, whatever it measures: the worst case for a switch's exactness."""

from collections.abc import Collection

from ssd.engine.mode_choice import SPECULATE_OR_PLAIN, ModeChooser


class CyclingChooser(ModeChooser):
    """Takes its options in turn, one step each (speculate, plain; in SSD batches speculate, sd, plain)."""

    def choose(self, batch_size: int, options: tuple[str, ...] = SPECULATE_OR_PLAIN, lookahead: int = 0,
               unseen: int = 0,
               seq_ids: Collection[int] | None = None) -> str:
        return options[sum(self.num_rounds.values()) % len(options)]
