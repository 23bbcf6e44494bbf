"""`ssd chat`: an interactive, streaming, multi-turn chat with a running gateway (or a stack it starts).

The history is the list of finished turns; a turn cancelled with Ctrl-C is dropped (its stream is
closed, which makes the gateway cancel the target call), and the session goes on. `/exit` or EOF quits.
"""

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PROMPT = "you> "


@dataclass(frozen=True)
class ChatConfig:
    url: str  # gateway base URL, e.g. http://127.0.0.1:8000
    api_key: str
    model: str | None  # None = the gateway's first served model
    mode: str | None  # "ar" | "sd" | "ssd"; None = the server default
    max_tokens: int
    temperature: float
    system: str | None
    is_showing_metrics: bool


@dataclass(frozen=True)
class AnswerMetrics:
    num_tokens: int
    ttft_s: float
    decode_tok_s: float
    tokens_per_round: float | None  # mean accepted length: tokens emitted per verification round (sd)
    accept_rate: float | None  # accepted draft tokens / proposed
    prefix_cache_hit: float | None  # prompt tokens served by the target's prefix cache
    cache_hit_rate: float | None = None  # ssd: rounds whose speculation came from the draft's cache

    def line(self) -> str:
        parts = [f"{self.num_tokens} tokens", f"{self.decode_tok_s:.1f} tok/s", f"TTFT {1000 * self.ttft_s:.0f} ms"]
        if self.tokens_per_round is not None:
            parts.append(f"mean accepted length {self.tokens_per_round:.2f}")
        if self.accept_rate is not None:
            parts.append(f"accept rate {100 * self.accept_rate:.0f}%")
        if self.cache_hit_rate is not None:
            parts.append(f"speculation cache hit {100 * self.cache_hit_rate:.0f}%")
        if self.prefix_cache_hit is not None:
            parts.append(f"prefix cache hit {100 * self.prefix_cache_hit:.0f}%")
        return "[" + ", ".join(parts) + "]"


def _metrics(usage: dict | None, num_chunks: int, start: float, first: float | None, last: float) -> AnswerMetrics:
    usage = usage or {}
    num_tokens = usage.get("completion_tokens") or num_chunks
    first = first or last
    decode_s = last - first
    spec = usage.get("speculation") or {}
    num_drafts = spec.get("num_drafts") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    prompt_tokens = usage.get("prompt_tokens") or 0
    lookups = (spec.get("num_cache_hits") or 0) + (spec.get("num_cache_misses") or 0)
    return AnswerMetrics(
        num_tokens=num_tokens, ttft_s=first - start,
        decode_tok_s=(num_tokens - 1) / decode_s if num_tokens > 1 and decode_s > 0 else 0.0,
        tokens_per_round=num_tokens / num_drafts if num_drafts else None,
        accept_rate=spec["num_accepted_tokens"] / spec["num_draft_tokens"] if spec.get("num_draft_tokens") else None,
        prefix_cache_hit=cached / prompt_tokens if cached is not None and prompt_tokens else None,
        cache_hit_rate=spec["num_cache_hits"] / lookups if lookups else None)


class ChatSession:
    def __init__(self, config: ChatConfig) -> None:
        from openai import OpenAI

        self.config = config
        self.client = OpenAI(base_url=config.url.rstrip("/") + "/v1", api_key=config.api_key, max_retries=0)
        self.model = config.model or self.client.models.list().data[0].id
        self.history: list[dict] = [{"role": "system", "content": config.system}] if config.system else []

    def answer(self, text: str) -> AnswerMetrics | None:
        """Stream one answer to stdout; None (and no history change) when Ctrl-C cancels it."""
        messages = [*self.history, {"role": "user", "content": text}]
        start = time.perf_counter()
        stream = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=self.config.max_tokens,
            temperature=self.config.temperature, stream=True, stream_options={"include_usage": True},
            extra_body={"mode": self.config.mode} if self.config.mode else None)
        pieces: list[str] = []
        first, usage = None, None
        try:
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    first = first or time.perf_counter()
                    pieces.append(chunk.choices[0].delta.content)
                    sys.stdout.write(pieces[-1])
                    sys.stdout.flush()
                if chunk.usage is not None:
                    usage = chunk.usage.model_dump()
        except KeyboardInterrupt:
            stream.close()  # the gateway sees the disconnect and cancels the generation
            sys.stdout.write("\n[cancelled]\n")
            return None
        last = time.perf_counter()
        sys.stdout.write("\n")
        self.history += [{"role": "user", "content": text}, {"role": "assistant", "content": "".join(pieces)}]
        return _metrics(usage, len(pieces), start, first, last)


def _read_line() -> str | None:
    """The next user message; None at EOF. Ctrl-C at the prompt just gives a fresh prompt."""
    while True:
        try:
            return input(PROMPT)
        except EOFError:
            return None
        except KeyboardInterrupt:
            sys.stdout.write("\n")


def chat_loop(session: ChatSession) -> None:
    # Ctrl-C must cancel an answer even when this process was started with SIGINT ignored (e.g. from a
    # background job of a non-interactive shell, which is how CI scripts often launch things)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"chatting with {session.model} at {session.config.url} (mode: {session.config.mode or 'server default'})"
          "; /exit or Ctrl-D quits, Ctrl-C cancels an answer")
    while (line := _read_line()) is not None:
        text = line.strip()
        if text == "/exit":
            break
        if not text:
            continue
        try:
            metrics = session.answer(text)
        except KeyboardInterrupt:  # before the first byte arrived
            sys.stdout.write("\n[cancelled]\n")
            continue
        if metrics is not None and session.config.is_showing_metrics:
            print(metrics.line())


def add_chat_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="gateway base URL")
    p.add_argument("--api-key", default=None, help="bearer key (default: $SSD_API_KEY, else none)")
    p.add_argument("--model", default=None, help="model name (default: the gateway's)")
    p.add_argument("--mode", default=None, choices=["ar", "sd", "ssd", "auto"], help="decoding mode (default: the server's)")
    p.add_argument("--metrics", action="store_true", help="print tokens, tok/s, TTFT, accepted length per answer")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--system", default=None, help="a system message opening the conversation")
    p.add_argument("--local", action="store_true", help="start a local stack (draft, target, gateway) first")
    p.add_argument("--local-model", default="smollm2-135m-instruct", help="target model of the --local stack")
    p.add_argument("--local-draft", default="ngram",
                   help="draft of the --local stack: 'ngram', a draft checkpoint or an EAGLE-3 head (ssd needs one)")
    p.add_argument("--offline", action="store_true",
                   help="--local: never download; a model that is not cached is an error (also SSD_OFFLINE=1)")
    p.set_defaults(func=main)


def _start_local(args: argparse.Namespace):  # noqa: ANN202 (deploy.local.Stack | None: grpc only when used)
    """The --local stack (its known models pulled first unless offline); None after one line saying why not."""
    from deploy.local import StackConfig, StackStartError, free_port, start_stack
    from ssd.config import EngineConfig
    from ssd.fetch import is_offline

    log_dir = Path("out/chat-logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"starting a local stack (logs in {log_dir}/) ...")
    try:
        return start_stack(StackConfig(EngineConfig(args.local_model), draft=args.local_draft, http_port=free_port(),
                                       grpc_port=free_port(), log_dir=log_dir,
                                       offline=args.offline or is_offline()))
    except StackStartError as e:
        sys.stderr.write(f"ssd chat: cannot start the local stack: {e}\n")
        return None


def main(args: argparse.Namespace) -> int:
    stack = None
    url = args.url
    if args.local:
        stack = _start_local(args)
        if stack is None:
            return 1
        url = stack.url
    try:
        config = ChatConfig(url=url, api_key=args.api_key or os.environ.get("SSD_API_KEY", "none"),
                            model=args.model, mode=args.mode, max_tokens=args.max_tokens,
                            temperature=args.temperature, system=args.system, is_showing_metrics=args.metrics)
        chat_loop(ChatSession(config))
    finally:
        if stack is not None:
            from deploy.local import stop_stack

            stop_stack(stack)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m deploy.chat", description=__doc__)
    add_chat_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
