"""Soak: mixed traffic at a fixed concurrency through a supervised `ssd serve` for a long time, sampling each
service's RSS, open file descriptors, KV blocks in use and this node's /dev/shm tensor segments.

    python -m bench.soak --minutes 30 --concurrency 32 --log-dir /tmp/ssd-soak     # the full soak
    python -m bench.soak --minutes 3 --concurrency 8                               # a short one

Traffic (bench/soak_traffic.py): streamed and whole chat requests in modes ar / sd / ssd, structured output,
cancels, bad requests (4xx expected) and too-short deadlines (504 expected), through a stack whose draft serves
ssd (the shipped EAGLE-3 head by default). The report (bench/soak_report.py, also written to soak.md) gives
per-process RSS at start / after warm-up / end and the pass criteria: KV blocks and /dev/shm segments back to
their baseline, RSS growth after warm-up < 10%, no unexpected answer; the exit status is 0 when all held.
The CSV (soak.csv, rewritten at each sample) has every sample.
"""

import argparse
import csv
import re
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import grpc

from bench.chaos import Serve, start_serve
from bench.soak_report import report
from bench.soak_traffic import traffic
from protos.ssd.v1 import common_pb2, draft_pb2_grpc, target_pb2_grpc
from rpc.shared_memory import live_segments
from ssd.model_store import DEFAULT_DRAFT

_SEGMENT = re.compile(r"/dev/shm/(ssd-[0-9a-f]{16})")  # rpc/shared_memory.py's segment names
_STARTED = re.compile(r"address=(\S+).*pid=(\d+).*service=(\S+)")


def service_addresses(serve_out: Path) -> dict[str, str]:
    """Service name -> gRPC address, from the supervisor's "started" lines."""
    out = {}
    for line in serve_out.read_text(errors="replace").splitlines():
        if "started" in line and (m := _STARTED.search(line)):
            out[m.group(3)] = m.group(1)
    return out


def _proc_figures(pid: int) -> tuple[int, int, int]:
    """(RSS in KiB, open fds, /dev/shm tensor segments mapped) of a live process; zeros if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
        segments = set(_SEGMENT.findall(Path(f"/proc/{pid}/maps").read_text()))
        return rss, len(list(Path(f"/proc/{pid}/fd").iterdir())), len(segments)
    except (OSError, AttributeError):
        return 0, 0, 0


def _kv_used(name: str, address: str) -> int:
    stub_class = draft_pb2_grpc.SpeculatorStub if name == "draft" else target_pb2_grpc.VerifierStub
    try:
        with grpc.insecure_channel(address) as ch:
            return stub_class(ch).GetLoad(common_pb2.LoadRequest(), timeout=5).num_used_kv_blocks
    except grpc.RpcError:
        return -1


def sample(serve: Serve, addresses: dict[str, str]) -> dict[str, float]:
    # node-wide segments count other users' too (other stacks on this machine); per process: only ours
    row: dict[str, float] = {"t_s": time.monotonic(), "node_shm_segments": len(live_segments())}
    for kind, pids in serve.children().items():
        for i, pid in enumerate(sorted(pids)):
            rss, fds, segments = _proc_figures(pid)
            row[f"{kind}{i}_rss_mib"] = round(rss / 1024, 1)
            row[f"{kind}{i}_fds"] = fds
            row[f"{kind}{i}_shm_mapped"] = segments
    for name, address in addresses.items():
        if name != "gateway":
            row[f"{name}_kv_used"] = _kv_used(name, address)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.soak", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--targets", type=int, default=1)
    p.add_argument("--draft", default=DEFAULT_DRAFT, help="a draft that serves ssd (default: the EAGLE-3 head)")
    p.add_argument("--warmup-minutes", type=float, default=None, help="default: a sixth of --minutes")
    p.add_argument("--sample-s", type=float, default=15.0)
    p.add_argument("--settle-s", type=float, default=180.0,
                   help="after the traffic: wait up to this long for the KV in use to return to its baseline")
    p.add_argument("--log-dir", type=Path, default=Path("/tmp/ssd-soak"))
    a = p.parse_args(argv)
    serve = start_serve(a.log_dir, targets=a.targets, draft=a.draft)
    addresses = service_addresses(a.log_dir / "serve.out")
    stop = threading.Event()
    counts = [Counter() for _ in range(a.concurrency)]  # one per client thread, summed at the end
    rows = [sample(serve, addresses)]
    workers = [threading.Thread(target=traffic, args=(serve.url, stop, counts[seed], seed), daemon=True)
               for seed in range(a.concurrency)]
    for w in workers:
        w.start()
    try:
        end = time.monotonic() + 60 * a.minutes
        while time.monotonic() < end:
            time.sleep(min(a.sample_s, max(0.0, end - time.monotonic())))
            rows.append(sample(serve, addresses))
            _write_csv(rows, a.log_dir / "soak.csv")
    finally:
        stop.set()
        for w in workers:
            w.join(180)
        settle_s = settle(serve, addresses, rows[0], a.settle_s)
        rows.append(sample(serve, addresses))  # idle again: KV and segments back to their baseline
        code = serve.stop()
    _write_csv(rows, a.log_dir / "soak.csv")
    warmup_s = 60 * (a.warmup_minutes if a.warmup_minutes is not None else a.minutes / 6)
    header = (f"soak: {a.minutes} min at concurrency {a.concurrency}, draft {a.draft}, {len(rows)} samples; "
              f"KV settled {settle_s:.1f} s after the traffic stopped; ssd serve exited {code}")
    text, passed = report(rows, sum(counts, Counter()), warmup_s, header)
    (a.log_dir / "soak.md").write_text(text)
    sys.stdout.write(text + f"\nall samples: {a.log_dir / 'soak.csv'}\n")
    return 0 if passed and code == 0 else 1


def settle(serve: Serve, addresses: dict[str, str], baseline: dict[str, float], limit_s: float) -> float:
    """Seconds until every KV series is back at its baseline (requests left behind by clients that timed out
    may still be finishing); `limit_s` if it never is."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        row = sample(serve, addresses)
        if all(row.get(k) == v for k, v in baseline.items() if k.endswith("_kv_used")):
            return time.monotonic() - started
        time.sleep(2)
    return limit_s


def _write_csv(rows: list[dict[str, float]], path: Path) -> None:
    keys = sorted({k for r in rows for k in r})
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    raise SystemExit(main())
