"""What structured output costs: the same JSON requests with and without a JSON schema, in AR, SD and SSD.

    python -m bench.structured_output --json bench/results/structured_output.json

Eight chat prompts asking for a JSON record (the schema below: strings with maxLength, a boolean, a short
array), batch 1, greedy, in one process on one thread. Each mode runs them free and under the schema; a
speculative mode also under the schema with a draft blind to it (the target still splices forced tokens in),
and with neither (no splicing, a blind draft: speculation as it was before the grammar helped). It reports
decode tokens/s,
tokens per round (and SSD's cache hit rate), and the time spent in the grammar. Free text and JSON answers
differ in length and content, so compare tok/s within a variant. SSD runs in one process here (answer, then
build, in turn): its tokens per round and hit rate are the services', its tok/s is not (`ssd bench` is).
"""

import argparse
import json
import time
from contextlib import nullcontext

import torch

from ssd.config import ProposerChoice, SpeculationConfig, SsdConfig, TreeShape
from ssd.engine import speculative_decoder
from ssd.llm import LLM
from ssd.sampling import grammar as grammar_module
from ssd.sampling.grammar import Grammar
from ssd.sampling.params import SamplingParams

SUBJECTS = ["Paris", "a golden retriever", "the planet Mars", "a bicycle", "Ada Lovelace", "the Nile river",
            "a cup of coffee", "the Python language"]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "kind", "famous", "facts"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "kind": {"type": "string", "maxLength": 24},
                         "famous": {"type": "boolean"},
                         "facts": {"type": "array", "items": {"type": "string", "maxLength": 60}, "maxItems": 3}}}


class MaskTimer:
    """Adds up the seconds spent in the grammar: the verify's masks (GrammarState.allowed, counted as calls) and
    the splicing of forced tokens (GrammarState.forced_chain / forced_tree)."""

    METHODS = ("allowed", "forced_chain", "forced_tree")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._real = {name: getattr(grammar_module.GrammarState, name) for name in self.METHODS}

    def _timed(self, name: str):  # noqa: ANN202
        timer, real = self, self._real[name]

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            began = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                timer.seconds += time.perf_counter() - began
                timer.calls += name == "allowed"

        return timed

    def __enter__(self) -> "MaskTimer":
        for name in self.METHODS:
            setattr(grammar_module.GrammarState, name, self._timed(name))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, real in self._real.items():
            setattr(grammar_module.GrammarState, name, real)


class NoSplicing:
    """The speculation as the draft made it: no forced tokens spliced in."""

    def __enter__(self) -> None:
        self._real = speculative_decoder.SpeculativeDecoder._with_forced_tokens
        speculative_decoder.SpeculativeDecoder._with_forced_tokens = lambda self, seq, speculation, k: speculation  # type: ignore

    def __exit__(self, *exc: object) -> None:
        speculative_decoder.SpeculativeDecoder._with_forced_tokens = self._real  # type: ignore[method-assign]


class BlindDraft:
    """The draft does not see the grammar (proposers get no AnswerGrammar); the target still enforces it."""

    def __enter__(self) -> None:
        self._real = speculative_decoder.AnswerGrammar
        speculative_decoder.AnswerGrammar = lambda *_: None  # type: ignore[assignment,misc]

    def __exit__(self, *exc: object) -> None:
        speculative_decoder.AnswerGrammar = self._real  # type: ignore[misc]


def run_mode(llm: LLM, prompts: list[str], max_tokens: int, grammar: Grammar | None, splice: bool = True,
             draft_sees: bool = True) -> dict:
    params = SamplingParams(max_tokens=max_tokens, grammar=grammar)
    llm.generate(prompts[0], SamplingParams(max_tokens=4))  # warm-up
    tokens, decode_s, rounds, emitted, valid, hits = 0, 0.0, 0, 0, 0, 0
    with (MaskTimer() as masks, (nullcontext() if splice else NoSplicing()),
          (nullcontext() if draft_sees else BlindDraft())):
        for prompt in prompts:  # batch 1
            began = time.perf_counter()
            out = llm.generate(prompt, params)[0]
            ended = time.perf_counter()
            tokens += len(out.token_ids) - 1
            decode_s += ended - began - (out.ttft_s or 0.0)
            if out.spec is not None:
                rounds += out.spec.num_drafts
                emitted += out.spec.num_emitted_tokens
                hits += out.spec.num_cache_hits
            if grammar is not None:
                try:
                    json.loads(out.text)
                    valid += 1
                except json.JSONDecodeError:
                    pass
    return {"decode_tok_s": round(tokens / decode_s, 2), "generated_tokens": tokens,
            "tokens_per_round": round(emitted / rounds, 3) if rounds else None,
            "cache_hit_rate": round(hits / rounds, 3) if hits else None,
            "mask_ms_total": round(1000 * masks.seconds, 1), "mask_calls": masks.calls,
            "mask_share_of_decode": round(masks.seconds / decode_s, 4),
            "valid_json": valid if grammar is not None else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--draft", default="smollm2-135m-eagle3")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--tree-budget", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--modes", default="ar,sd_chain,sd_tree,ssd_in_process", help="comma-separated, of the default")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    grammar = Grammar("json_schema", json.dumps(SCHEMA))
    speculations = {"ar": None, "sd_chain": SpeculationConfig(ProposerChoice(args.draft), num_speculative_tokens=args.k),
                    "sd_tree": SpeculationConfig(ProposerChoice(args.draft), num_speculative_tokens=args.k,
                                                 tree=TreeShape(budget=args.tree_budget, depth=args.k, top_k=2)),
                    "ssd_in_process": SpeculationConfig(ProposerChoice(args.draft), num_speculative_tokens=args.k,
                                                        ssd=SsdConfig())}
    results: dict = {"command": vars(args), "schema": SCHEMA}
    for name, speculation in ((n, speculations[n]) for n in args.modes.split(",")):
        llm = LLM(args.model, dtype=args.dtype, num_threads=args.threads, speculation=speculation)
        prompts = [llm.chat_prompt([{"role": "user", "content": f"Describe {s} as a JSON record."}])
                   for s in SUBJECTS]
        variants = [("free", None, True, True), ("json_schema", grammar, True, True)]
        if speculation is not None:
            variants += [("json_schema_blind_draft", grammar, True, False),
                         ("json_schema_unspliced_blind_draft", grammar, False, False)]
        for label, g, splice, sees in variants:
            results[f"{name}/{label}"] = run_mode(llm, prompts, args.max_tokens, g, splice, sees)
            print(name, label, results[f"{name}/{label}"], flush=True)  # noqa: T201 (a benchmark's report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
