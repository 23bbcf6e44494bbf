"""SSD on the wire, target side: the one mapping of the engine's modes and SSD settings to the proto (a
Prefill's mode, the session's SsdOptions in Hello), and the draft's timings summed for benchmarks."""

from dataclasses import dataclass

from protos.ssd.v1 import common_pb2, draft_pb2
from ssd.config import Backup, DecodeMode, FanOut, SsdConfig

PREFILL_MODES = {DecodeMode.SD: common_pb2.SPECULATION_MODE_SD, DecodeMode.SSD: common_pb2.SPECULATION_MODE_SSD}
FAN_OUT_KINDS = {FanOut.GEOMETRIC: draft_pb2.FAN_OUT_KIND_GEOMETRIC, FanOut.UNIFORM: draft_pb2.FAN_OUT_KIND_UNIFORM}
BACKUP_KINDS = {Backup.AUTO: draft_pb2.BACKUP_KIND_AUTO, Backup.NEURAL: draft_pb2.BACKUP_KIND_NEURAL,
                Backup.FAST: draft_pb2.BACKUP_KIND_FAST}


def ssd_options(config: SsdConfig) -> draft_pb2.SsdOptions:
    """The session's SSD settings for Hello.ssd (a fan-out budget of 0 reads as "the draft's default" on the
    wire; backup_max_neural_batch has no field: the draft's own applies)."""
    return draft_pb2.SsdOptions(fan_out_budget=config.fan_out_budget, fan_out_kind=FAN_OUT_KINDS[config.fan_out],
                                backup_kind=BACKUP_KINDS[config.backup], saguaro_c=config.saguaro_c)


@dataclass
class DraftTimings:
    """Sums of the draft's SsdTimings over the answers that carried them (divide by num_answers for means)."""

    num_answers: int = 0  # rounds the draft answered from its SSD cache (hits or backups)
    lookup_ms: float = 0.0  # cache lookups
    backup_ms: float = 0.0  # backup drafting for the misses
    last_build_ms: float = 0.0  # the cache builds before those answers (they overlapped the target's verify)
    build_wait_ms: float = 0.0  # answers waiting on the draft's worker, behind the previous build
    build_fan_out_budget: float = 0.0  # guesses per sequence those builds prepared (fitted, or the session's budget)

    def add(self, t: draft_pb2.SsdTimings) -> None:
        self.num_answers += 1
        self.lookup_ms += t.lookup_ms
        self.backup_ms += t.backup_ms
        self.last_build_ms += t.last_build_ms
        self.build_wait_ms += t.build_wait_ms
        self.build_fan_out_budget += t.build_fan_out_budget
