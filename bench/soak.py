"""Soak: mixed traffic at a fixed concurrency through a supervised `ssd serve` for a long time, sampling each
service's RSS, open file descriptors, KV blocks in use and this node's /dev/shm tensor segments.

    python -m bench.soak --minutes 30 --concurrency 32 --log-dir /tmp/ssd-soak     # the full soak
    python -m bench.soak --minutes 3 --concurrency 8                               # a short one

Traffic: streamed and whole chat requests, modes sd and ar, 8 to 96 new tokens, a few cancelled early.
A leak shows as a figure that keeps growing after warm-up: the summary prints each series' first, last and
peak sample, and the CSV has them all.
"""

import argparse
import csv
import itertools
import random
import re
import sys
import threading
import time
from pathlib import Path

import grpc

from bench.chaos import PROMPTS, Serve, StreamResult, client, run_stream, start_serve
from protos.ssd.v1 import common_pb2, draft_pb2_grpc, target_pb2_grpc
from rpc.shared_memory import live_segments

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


def traffic(url: str, stop: threading.Event, counts: dict[str, int], seed: int) -> None:
    """One client's loop of mixed requests until `stop`."""
    rng = random.Random(seed)
    c = client(url)
    while not stop.is_set():
        prompt, max_tokens, mode = rng.choice(PROMPTS), rng.randint(8, 96), rng.choice(["sd", "sd", "ar"])
        if rng.random() < 0.1:  # cancelled early: the client goes away after the first tokens
            r = StreamResult()
            cancel = threading.Thread(target=run_stream, args=(client(url, timeout_s=1.0), prompt, 400, r, mode))
            cancel.start()
            cancel.join()
            counts["cancelled"] += 1
            continue
        r = StreamResult()
        run_stream(c, prompt, max_tokens, r, mode)
        counts["failed" if r.error else "ok"] += 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.soak", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--targets", type=int, default=1)
    p.add_argument("--draft", default="ngram")
    p.add_argument("--sample-s", type=float, default=15.0)
    p.add_argument("--log-dir", type=Path, default=Path("/tmp/ssd-soak"))
    a = p.parse_args(argv)
    serve = start_serve(a.log_dir, targets=a.targets, draft=a.draft)
    addresses = service_addresses(a.log_dir / "serve.out")
    stop, counts = threading.Event(), {"ok": 0, "failed": 0, "cancelled": 0}
    rows = [sample(serve, addresses)]
    workers = [threading.Thread(target=traffic, args=(serve.url, stop, counts, seed), daemon=True)
               for seed in range(a.concurrency)]
    for w in workers:
        w.start()
    try:
        end = time.monotonic() + 60 * a.minutes
        for _ in itertools.count():
            if time.monotonic() >= end:
                break
            time.sleep(min(a.sample_s, max(0.0, end - time.monotonic())))
            rows.append(sample(serve, addresses))
    finally:
        stop.set()
        for w in workers:
            w.join(120)
        time.sleep(2)
        rows.append(sample(serve, addresses))  # idle again: KV and segments back to their baseline
        code = serve.stop()
    write_report(rows, counts, a, code)
    return 0


def write_report(rows: list[dict[str, float]], counts: dict[str, int], a: argparse.Namespace, code: int) -> None:
    keys = sorted({k for r in rows for k in r})
    with open(a.log_dir / "soak.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    lines = [f"soak: {a.minutes} min at concurrency {a.concurrency}; requests {counts}; ssd serve exited {code}",
             "| series | first | last (idle) | peak |", "|---|---|---|---|"]
    for k in keys:
        if k == "t_s":
            continue
        values = [r[k] for r in rows if k in r]
        lines.append(f"| {k} | {values[0]} | {values[-1]} | {max(values)} |")
    sys.stdout.write("\n".join(lines) + f"\n\nall samples: {a.log_dir / 'soak.csv'}\n")


if __name__ == "__main__":
    raise SystemExit(main())
