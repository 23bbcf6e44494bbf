"""SSD on the wire, draft side: the one mapping of the proto's modes and SSD options to the engine's enums, and the
timings a reply carries. An unknown value is InvalidRequestError (INVALID_ARGUMENT)."""

from dataclasses import replace

from protos.ssd.v1 import common_pb2, draft_pb2
from ssd.config import Backup, DecodeMode, FanOut, SsdConfig, parse_enum
from ssd.errors import InvalidRequestError
from ssd.speculation.ssd_speculator import SsdCounters

MODES = {common_pb2.SPECULATION_MODE_SD: DecodeMode.SD, common_pb2.SPECULATION_MODE_SSD: DecodeMode.SSD}
FAN_OUTS = {draft_pb2.FAN_OUT_KIND_GEOMETRIC: FanOut.GEOMETRIC, draft_pb2.FAN_OUT_KIND_UNIFORM: FanOut.UNIFORM}
BACKUPS = {draft_pb2.BACKUP_KIND_AUTO: Backup.AUTO, draft_pb2.BACKUP_KIND_NEURAL: Backup.NEURAL,
           draft_pb2.BACKUP_KIND_FAST: Backup.FAST}


def prefill_mode(p: draft_pb2.Prefill) -> DecodeMode:
    """SD or SSD: `mode`, else the deprecated `ssd` flag."""
    if p.mode == common_pb2.SPECULATION_MODE_UNSPECIFIED:
        return DecodeMode.SSD if p.ssd else DecodeMode.SD
    if p.mode not in MODES:
        raise InvalidRequestError(f"a Prefill's mode must be SPECULATION_MODE_SD or _SSD, got {p.mode}")
    return MODES[p.mode]


def _kind(table: dict, value: int, old: str, default: FanOut | Backup, what: str) -> FanOut | Backup:
    """The enum field where set, else the deprecated string field where set, else `default`."""
    if value:
        if value not in table:
            raise InvalidRequestError(f"SSD options: unknown {what} {value}")
        return table[value]
    return parse_enum(type(default), old, what) if old else default


def options_config(default: SsdConfig, options: draft_pb2.SsdOptions) -> SsdConfig:
    """The draft's SSD settings with `options` over them where set (unset / 0.0 / "" = the default; a fan-out
    budget that is set counts, 0 included).

    Raises InvalidRequestError for a bad value (e.g. saguaro_c = 2, an unknown fan-out kind).
    """
    return replace(default, fan_out_budget=(options.fan_out_budget if options.HasField("fan_out_budget")
                                   else default.fan_out_budget),
                   fan_out=_kind(FAN_OUTS, options.fan_out_kind, options.fan_out, default.fan_out, "fan-out"),
                   backup=_kind(BACKUPS, options.backup_kind, options.backup, default.backup, "backup"),
                   saguaro_c=options.saguaro_c or default.saguaro_c)


def timings(counters: SsdCounters, last_build_s: float, last_build_budget: int,
            wait_s: float) -> draft_pb2.SsdTimings:
    """This answer's lookup and backup times, the session's previous build, and the wait for the worker."""
    return draft_pb2.SsdTimings(lookup_ms=1e3 * counters.last_lookup_s, backup_ms=1e3 * counters.last_backup_s,
                                last_build_ms=1e3 * last_build_s, build_wait_ms=1e3 * wait_s,
                                build_fan_out_budget=last_build_budget)
