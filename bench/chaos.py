"""Chaos under load: while N greedy streams run through a supervised `ssd serve`, kill -9 one component
(the draft, a target replica, the gateway) and count what each client saw.

    python -m bench.chaos --streams 8 --targets 2 --max-tokens 48 --log-dir /tmp/chaos

Per kill: completed with the reference text (the stack's own ar answer, float32: speculation is lossless),
completed with other text (a bug), failed cleanly (an OpenAI-shaped error, or the connection closed when the
gateway itself died), lost (still hanging after the timeout; must be 0). Then the supervisor must restart the
component and a request must succeed again; the seconds that took are the recovery column.
"""

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import openai

from rpc.ports import free_port

MODEL = "smollm2-135m-instruct"
PROMPTS = ["Count from one to thirty in words, separated by commas.", "Write a haiku about the sea.",
           "List the planets of the solar system.", "What is 12 times 7? Explain step by step.",
           "Name five fruits and their colors.", "Describe a cat in three sentences.",
           "Write the alphabet backwards.", "Give three tips for learning to code."]
SERVICE_MODULES = {"draft_service": "draft", "target_service": "target", "gateway": "gateway"}


@dataclass
class Serve:
    """A supervised `ssd serve` process and its URL."""

    proc: subprocess.Popen
    url: str

    def children(self) -> dict[str, list[int]]:
        """Service kind ("draft", "target", "gateway") -> pids of the supervisor's live children of that kind."""
        out: dict[str, list[int]] = {}
        try:
            pids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            return out
        for pid in map(int, pids):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            module = argv[argv.index(b"-m") + 1].decode() if b"-m" in argv else ""
            if module in SERVICE_MODULES:
                out.setdefault(SERVICE_MODULES[module], []).append(pid)
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_serve(log_dir: Path, targets: int = 1, draft: str = "ngram", timeout_s: float = 300.0,
                api_key: str = "chaos-key") -> Serve:
    """`ssd serve` (float32, its own free ports) in a new session; returns once its banner says it is up."""
    port, grpc_port = free_port(), free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    key_file = log_dir / "api-key"
    key_file.write_text(api_key + "\n")
    argv = [sys.executable, "-m", "cli.main", "serve", "--draft", draft, "--dtype", "float32", "--targets",
            str(targets), "--port", str(port), "--grpc-port", str(grpc_port), "--api-key-file", str(key_file),
            "--log-dir", str(log_dir), "--k", "3"]
    out = open(log_dir / "serve.out", "wb")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    out.close()
    deadline = time.monotonic() + timeout_s
    while b"ssd-serve is up" not in (log_dir / "serve.out").read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            Serve(proc, "").stop()
            raise RuntimeError(f"ssd serve did not come up: {(log_dir / 'serve.out').read_text()[-2000:]}")
        time.sleep(0.5)
    return Serve(proc, f"http://127.0.0.1:{port}")


def client(url: str, api_key: str = "chaos-key", timeout_s: float = 120.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=timeout_s)


@dataclass
class StreamResult:
    text: str = ""
    num_chunks: int = 0
    error: str | None = None  # the exception's class name
    done: threading.Event = field(default_factory=threading.Event)


def run_stream(c: openai.OpenAI, prompt: str, max_tokens: int, result: StreamResult, mode: str = "sd") -> None:
    try:
        chunks = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                           max_tokens=max_tokens, temperature=0, stream=True,
                                           extra_body={"mode": mode})
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                result.text += chunk.choices[0].delta.content
                result.num_chunks += 1
    except openai.OpenAIError as e:  # an OpenAI-shaped error, or the connection closed
        result.error = type(e).__name__
    finally:
        result.done.set()


def reference(c: openai.OpenAI, prompts: list[str], max_tokens: int) -> dict[str, str]:
    """Each prompt's greedy text from the stack itself, without speculation."""
    out = {}
    for prompt in prompts:
        r = StreamResult()
        run_stream(c, prompt, max_tokens, r, mode="ar")
        if r.error is not None:
            raise RuntimeError(f"reference request failed: {r.error}")
        out[prompt] = r.text
    return out


@dataclass
class ChaosRow:
    killed: str
    num_in_flight: int
    num_identical: int
    num_different: int
    num_failed_clean: int
    num_lost: int
    errors: list[str]
    restart_s: float | None  # kill -> the supervisor's new process of that kind is running
    recovery_s: float | None  # kill -> the next request served after the streams ended


def wait_served(c: openai.OpenAI, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = StreamResult()
        run_stream(c, "Say yes.", 2, r, mode="ar")
        if r.error is None and r.text:
            return True
        time.sleep(0.5)
    return False


def start_streams(c, expected: dict[str, str], num_streams: int, max_tokens: int,  # noqa: ANN001 - an OpenAI client
                  min_chunks: int) -> tuple[list[str], list[StreamResult]]:
    """Start `num_streams` streams over the expected prompts in turn; return once each has streamed `min_chunks`
    chunks (or ended), or after a minute."""
    prompts = [list(expected)[i % len(expected)] for i in range(num_streams)]
    results = [StreamResult() for _ in prompts]
    for prompt, r in zip(prompts, results, strict=True):
        threading.Thread(target=run_stream, args=(c, prompt, max_tokens, r), daemon=True).start()
    deadline = time.monotonic() + 60
    while not all(r.num_chunks >= min_chunks or r.done.is_set() for r in results) and time.monotonic() < deadline:
        time.sleep(0.05)
    return prompts, results


def kill_under_load(serve: Serve, kind: str, expected: dict[str, str], num_streams: int, max_tokens: int,
                    stream_timeout_s: float = 180.0, recovery_timeout_s: float = 240.0) -> ChaosRow:
    """Start the streams, kill -9 the first live `kind` child once every stream has streamed, classify."""
    c = client(serve.url)
    prompts, results = start_streams(c, expected, num_streams, max_tokens, min_chunks=2)
    victims = serve.children().get(kind, [])
    if not victims:
        raise RuntimeError(f"no live {kind} child to kill")
    os.kill(victims[0], signal.SIGKILL)
    killed_at = time.monotonic()
    in_flight = sum(not r.done.is_set() for r in results)
    restarted: list[float] = []
    watcher = threading.Thread(target=_wait_replaced, args=(serve, kind, victims, restarted, recovery_timeout_s),
                               daemon=True)
    watcher.start()
    for r in results:
        r.done.wait(max(0.0, killed_at + stream_timeout_s - time.monotonic()))
    watcher.join(recovery_timeout_s)
    recovered = wait_served(c, recovery_timeout_s)
    row = ChaosRow(kind, in_flight, 0, 0, 0, 0, [], restarted[0] - killed_at if restarted else None,
                   time.monotonic() - killed_at if recovered else None)
    for prompt, r in zip(prompts, results, strict=True):
        if not r.done.is_set():
            row.num_lost += 1
        elif r.error is not None:
            row.num_failed_clean += 1
            row.errors.append(r.error)
        elif r.text == expected[prompt]:
            row.num_identical += 1
        else:
            row.num_different += 1
    return row


def stop_under_load(serve: Serve, expected: dict[str, str], num_streams: int, max_tokens: int,
                    timeout_s: float = 120.0) -> tuple[int, list[StreamResult]]:
    """SIGTERM the supervisor while streams run: (its exit code, the streams). Each child drains within its
    grace period, so streams that end within it complete."""
    c = client(serve.url)
    _, results = start_streams(c, expected, num_streams, max_tokens, min_chunks=1)
    code = serve.stop()
    for r in results:
        r.done.wait(timeout_s)
    return code, results


def _wait_replaced(serve: Serve, kind: str, old: list[int], out: list[float], timeout_s: float) -> None:
    """Append the time at which a process of `kind` that is not one of `old` runs under the supervisor."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if set(serve.children().get(kind, [])) - set(old):
            out.append(time.monotonic())
            return
        time.sleep(0.05)


def _seconds(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "never"


def table(rows: list[ChaosRow]) -> str:
    lines = ["| killed | in flight at the kill | completed identical | completed different | failed cleanly "
             "| lost | restarted after (s) | next request served after (s) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        errors = f" ({', '.join(sorted(set(r.errors)))})" if r.errors else ""
        lines.append(f"| {r.killed} | {r.num_in_flight} | {r.num_identical} | {r.num_different} | "
                     f"{r.num_failed_clean}{errors} | {r.num_lost} | {_seconds(r.restart_s)} | "
                     f"{_seconds(r.recovery_s)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.chaos", description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--targets", type=int, default=2)
    p.add_argument("--draft", default="ngram")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--kill", nargs="+", default=["draft", "target", "gateway"], choices=list(SERVICE_MODULES.values()))
    p.add_argument("--log-dir", type=Path, default=Path("/tmp/ssd-chaos"))
    a = p.parse_args(argv)
    serve = start_serve(a.log_dir, targets=a.targets, draft=a.draft)
    try:
        expected = reference(client(serve.url), PROMPTS[: max(1, min(a.streams, len(PROMPTS)))], a.max_tokens)
        rows = [kill_under_load(serve, kind, expected, a.streams, a.max_tokens) for kind in a.kill]
    finally:
        code = serve.stop()
    sys.stdout.write(f"{table(rows)}\n\nssd serve exited {code} after SIGTERM; logs in {a.log_dir}\n")
    ok = all(r.num_lost == 0 and r.num_different == 0 and r.restart_s is not None and r.recovery_s is not None
             for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
