"""SSD on the wire, draft side: a round's SsdOptions over the draft's defaults, and the timings a reply carries."""

from dataclasses import replace

from protos.ssd.v1 import draft_pb2
from ssd.config import SsdConfig
from ssd.speculation.ssd_speculator import SsdCounters


def round_config(default: SsdConfig, options: draft_pb2.SsdOptions) -> SsdConfig:
    """The draft's SSD defaults with the round's options where set (0 / "" = the default).

    Raises InvalidRequestError for a bad value (e.g. saguaro_c = 2).
    """
    return replace(default, fan_out_budget=options.fan_out_budget or default.fan_out_budget,
                   fan_out=options.fan_out or default.fan_out, backup=options.backup or default.backup,
                   saguaro_c=options.saguaro_c or default.saguaro_c)


def timings(counters: SsdCounters, last_build_s: float, wait_s: float) -> draft_pb2.SsdTimings:
    """This answer's lookup and backup times, the session's previous build, and the wait for the worker."""
    return draft_pb2.SsdTimings(lookup_ms=1e3 * counters.last_lookup_s, backup_ms=1e3 * counters.last_backup_s,
                                last_build_ms=1e3 * last_build_s, build_wait_ms=1e3 * wait_s)
