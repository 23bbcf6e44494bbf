"""Time decoding modes over a list of prompts; decode throughput is kept apart from prefill.

A group of `batch` prompts is generated together; its prefill time is the time to the last
first token, its decode time the rest. Every prompt generates exactly `output_len` tokens
(EOS does not stop it). Several modes and batch sizes run in one process, one after another,
so their ratios are measured under the same machine conditions; with `interleave` the modes of
a batch size take turns group by group, so they share the same minutes too.
"""

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
from tqdm.auto import tqdm

from bench.against import texts_sha256
from bench.datasets import Prompt
from bench.hf_baseline import HFGenerator
from bench.timing import GroupTiming
from ssd.config import Backup, DecodeMode, FanOut, ProposerChoice, SpeculationConfig, SsdConfig, TreeShape
from ssd.errors import InvalidRequestError
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from ssd.speculation.speculation_stats import SpecStats

Runner = Callable[[list[list[int]]], GroupTiming]


@dataclass(frozen=True)
class BenchSettings:
    mode: str
    model: str
    dataset: str
    output_len: int
    batch: int
    temperature: float
    dtype: str
    threads: int
    warmup: int = 1
    draft: str | None = None  # sd / hf-assisted: "ngram" or a draft folder / name
    k: int = 4  # lookahead
    tree: TreeShape | None = None
    draft_temperature: float | None = None
    fan_out_budget: int = 8  # ssd: bonus-token guesses per sequence and round
    fan_out: FanOut = FanOut.GEOMETRIC  # ssd: fan-out shape
    backup: Backup = Backup.FAST  # ssd: backup on a miss (SsdConfig's default)
    saguaro_c: float = 1.0  # ssd: Saguaro sampling constant
    backup_hits: bool = False  # ssd: a round with a neural backup re-drafts its hits too (the draft's flag)
    fit_fan_out: bool = True  # ssd: fit each build's budget to the verify (the draft's; False: --fixed-fan-out)
    draft_core: int | None = None  # ssd: CPU core of the draft process (None = not pinned)
    tensor_parallel_size: int = 1  # CPU ranks the target is sharded over (this process is rank 0)
    quantization: str = "none"  # the target's linear weights (EngineConfig.quantization)
    compile: str = "auto"  # torch.compile of the target's forward: auto | on | off (ssd/runtime/compile.py)
    enforce_eager: bool = False
    attention_backend: str = "auto"

    def engine_options(self, max_num_seqs: int) -> dict[str, object]:
        """The target engine's EngineConfig fields (this record keeps its own names: they are the JSON's keys)."""
        return {"dtype": self.dtype, "num_threads": self.threads, "max_num_seqs": max_num_seqs,
                "tensor_parallel_size": self.tensor_parallel_size, "quantization": self.quantization,
                "compile": self.compile, "enforce_eager": self.enforce_eager, "attention_backend": self.attention_backend}


def render_prompts(llm: LLM, prompts: list[Prompt]) -> list[list[int]]:
    texts = [llm.chat_prompt([{"role": "user", "content": p.text}]) if p.is_chat else p.text for p in prompts]
    return [llm.tokenizer.encode(t) for t in texts]


def _engine_runner(llm: LLM, params: SamplingParams) -> Runner:
    def run(group: list[list[int]]) -> GroupTiming:
        outs = llm.generate(group, params)
        prefill = max(o.ttft_s or 0.0 for o in outs)
        total = max(o.latency_s or 0.0 for o in outs)
        return GroupTiming([o.token_ids for o in outs], prefill, total)

    return run


def _speculation(s: BenchSettings) -> SpeculationConfig:
    return SpeculationConfig(ProposerChoice(s.draft or "ngram"), num_speculative_tokens=s.k, tree=s.tree,
                             k_schedule=((max(s.batch, 1), s.k),))


def _ssd_runner(s: BenchSettings, ar: LLM, params: SamplingParams, closers: list) -> tuple[Runner, LLM]:
    """The target engine here, its draft service in its own process (pinned to `draft_core`), SSD over gRPC."""
    from bench.draft_process import DraftProcess
    from target_service.remote_proposer import RemoteProposer

    if not s.draft or s.draft == "ngram":
        raise InvalidRequestError("--mode ssd needs a neural --draft (a draft model or an EAGLE-3 head)")
    draft = DraftProcess(s.draft, s.model, s.dtype, s.draft_core,
                         extra_args=(["--backup-hits"] if s.backup_hits else [])
                         + ([] if s.fit_fan_out else ["--fixed-fan-out"]))
    closers.append(draft.close)
    ssd = SsdConfig(fan_out_budget=s.fan_out_budget, fan_out=s.fan_out, backup=s.backup, saguaro_c=s.saguaro_c)
    proposer = RemoteProposer(draft.address, "bench", ar.engine.info.vocab_size, timeout_s=30.0,
                              feature_layers=tuple(draft.info.feature_layers), ssd_options=ssd)
    closers.append(proposer.close)
    deadline = time.monotonic() + 30
    while not proposer.is_connected and time.monotonic() < deadline:
        time.sleep(0.1)
    if not proposer.is_connected:
        raise InvalidRequestError(f"could not open a session with the draft service (log: {draft.log_path})")
    speculation = SpeculationConfig(ProposerChoice(s.draft), num_speculative_tokens=s.k,
                                    k_schedule=((max(s.batch, 1), s.k),))
    llm = LLM(s.model, proposer=proposer, speculation=speculation, **s.engine_options(s.batch))
    return _engine_runner(llm, replace(params, mode=DecodeMode.SSD)), llm


AUTO = "-auto"  # sd-auto / ssd-auto: that mode, taken per batch only where the engine measured it faster than plain
DRAFT_WAITS = "draft_waits"  # _chooser_rounds' key: plain steps taken while the draft was still prefilling


def _build_runner(s: BenchSettings, ar: LLM, params: SamplingParams, closers: list) -> tuple[Runner, LLM | None]:
    if s.mode.endswith(AUTO):
        return _build_runner(replace(s, mode=s.mode.removesuffix(AUTO)), ar, replace(params, adaptive=True), closers)
    if s.mode == "ar":
        return _engine_runner(ar, params), ar
    if s.mode == "sd":
        llm = LLM(s.model, speculation=_speculation(s), **s.engine_options(s.batch))
        return _engine_runner(llm, params), llm
    if s.mode == "ssd":
        return _ssd_runner(s, ar, params, closers)
    hf = HFGenerator(ar.engine.info.model_path, s.dtype, assistant=s.draft if s.mode == "hf-assisted" else None,
                     num_assistant_tokens=s.k, compiled=s.mode == "hf-compiled")
    return (lambda group: hf.generate(group, s.output_len, s.temperature)), None


SPECULATIVE_MODES = ("sd", "ssd", "sd-auto", "ssd-auto", "hf-assisted")  # the modes a --sweep over speculation settings applies to


def by_dataset(prompts: list[Prompt]) -> dict[str, list[Prompt]]:
    groups: dict[str, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault(p.dataset, []).append(p)
    return groups


def run_benchmarks(base: BenchSettings, modes: list[str], batches: list[int], prompts: list[Prompt],
                   sweep: tuple[str, list] | None = None, interleave: bool = False) -> list[dict]:
    """Every (mode, batch[, swept value], dataset) over the same prompts, in this process; one result dict each.

    `sweep` = (BenchSettings field, values) repeats the speculative modes at each value (e.g. ("k", [2, 4, 6]));
    a runner (and its model) is built once per setting and reused across the data sets. One after another, each
    setting runs every data set before the next starts; with `interleave`, the settings of a batch size take turns
    group by group (group 1 in every mode, then group 2, ...; each mode's warm-up first), so a slow minute of the
    machine falls on all of them, where whole runs minutes apart differed by as much as the modes do.
    """
    torch.set_num_threads(base.threads)
    ar = LLM(base.model, **base.engine_options(max(batches)))
    encoded = {name: render_prompts(ar, group) for name, group in by_dataset(prompts).items()}
    params = SamplingParams(temperature=base.temperature, max_tokens=base.output_len, ignore_eos=True, seed=1234,
                            draft_temperature=base.draft_temperature)
    entries = [(replace(base, mode=mode, batch=batch, **({sweep[0]: value} if value is not None else {})), value)
               for mode in modes for batch in batches
               for value in (sweep[1] if sweep and mode in SPECULATIVE_MODES else [None])]
    together = [[e for e in entries if e[0].batch == b] for b in batches] if interleave else [[e] for e in entries]
    results: list[dict] = []
    first_outputs: dict[str, list[list[int]]] = {}
    for turn in together:
        closers: list = []
        try:
            runners = [(settings, *_build_runner(settings, ar, params, closers)) for settings, _ in turn]
            for dataset, group in encoded.items():
                runs = [(replace(settings, dataset=dataset), run, llm) for settings, run, llm in runners]
                for result, (_, value) in zip(_run_in_turn(runs, group), turn, strict=True):
                    outputs = result.pop("_outputs")
                    result["outputs_text_sha256"] = texts_sha256([ar.decode(ids) for ids in outputs])
                    result.update(agreement(outputs, first_outputs.setdefault(dataset, outputs)))
                    if sweep is not None and value is not None:
                        result["sweep"] = {sweep[0]: value}
                    if interleave:
                        result["interleaved"] = True
                    results.append(result)
        finally:
            for close in reversed(closers):
                close()
    return results


Run = tuple[BenchSettings, Runner, LLM | None]  # a setting (its data set and batch size), its runner and engine


def _run_in_turn(runs: list[Run], encoded: list[list[int]]) -> list[dict]:
    """Warm every run up, then time every group of `batch` prompts in each run in turn (one run: one after another);
    per run the summary plus the raw outputs. The runs share a batch size."""
    batch = runs[0][0].batch
    for settings, run, _ in runs:
        for i in range(min(settings.warmup, len(encoded))):
            run(encoded[i : i + 1])
    before = [(_counters(llm), _chooser_rounds(llm)) for _, _, llm in runs]
    timings: list[list[GroupTiming]] = [[] for _ in runs]
    label = "/".join(settings.mode for settings, _, _ in runs)
    for i in tqdm(range(0, len(encoded), batch), desc=f"bench {label} batch {batch} {runs[0][0].dataset}",
                  unit="group"):
        for timed, (_, run, _) in zip(timings, runs, strict=True):
            timed.append(run(encoded[i : i + batch]))
    results = []
    for (settings, _, llm), timed, (counters, rounds) in zip(runs, timings, before, strict=True):
        result = summarize(settings, encoded, timed, _delta(counters, _counters(llm)))
        if settings.mode.endswith(AUTO):  # what the mode chooser took: decode steps of each choice
            chosen = {c: n - rounds[c] for c, n in _chooser_rounds(llm).items()}
            result["adaptive_draft_waits"] = chosen.pop(DRAFT_WAITS)  # of the plain steps: the draft was prefilling
            result["adaptive_rounds"] = chosen
        result["_outputs"] = [ids for t in timed for ids in t.token_ids]
        results.append(result)
    return results


def _chooser_rounds(llm: LLM | None) -> dict[str, int]:
    """The engine's mode chooser: decode steps taken so far per choice (speculate / sd / plain), and of the plain
    ones those taken while the draft was still prefilling (DRAFT_WAITS)."""
    if llm is None:
        return {}
    chooser = llm.engine.mode_chooser
    return {**chooser.num_rounds, DRAFT_WAITS: chooser.num_draft_waits}


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    """How far outputs match the first run's (bf16 kernels round differently for 1 and K+1 positions,
    so greedy bf16 runs can part ways at near-ties; float32 runs must match exactly)."""
    same = sum(a == b for a, b in zip(outputs, reference, strict=True))
    prefix = []
    for a, b in zip(outputs, reference, strict=True):
        n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        prefix.append(n / max(len(b), 1))
    return {"prompts_identical_to_first": same / len(reference),
            "mean_matching_prefix_vs_first": sum(prefix) / len(prefix)}


Counters = tuple[SpecStats, dict[str, float]]  # the engine's speculation stats, a remote draft's SSD timing sums


def _counters(llm: LLM | None) -> Counters | None:
    """A snapshot of the engine's speculation stats and, for a remote draft, its SSD timings."""
    if llm is None or llm.engine.speculative_decoder is None:
        return None
    timings = getattr(llm.engine.speculative_decoder.proposer, "draft_timings", None)  # RemoteProposer: the draft's own
    draft = {k: v for k, v in asdict(timings).items() if isinstance(v, int | float)} if timings is not None else {}
    return llm.engine.speculative_decoder.counters.snapshot(), draft


def _delta(before: Counters | None, after: Counters | None) -> Counters | None:
    if before is None or after is None:
        return None
    return after[0].since(before[0]), {k: v - before[1].get(k, 0) for k, v in after[1].items()}


def spec_summary(delta: Counters | None) -> dict:
    """The bench JSON's acceptance, cache and per-round timing keys, from a counter delta (see _counters)."""
    if delta is None or not delta[0].num_drafts:
        return {"tokens_per_round": None, "accept_rate": None}
    stats, draft = delta
    out = {"tokens_per_round": stats.tokens_per_round, "accept_rate": stats.accept_rate,
           "verify_ms_per_round": stats.verify_ms_per_round,
           "propose_ms_per_round": stats.propose_ms_per_round}  # ssd: the lookup round trip
    if stats.num_cache_lookups:
        out.update(cache_hit_rate=stats.cache_hit_rate, tokens_per_round_hit=stats.tokens_per_round_hit,
                   tokens_per_round_miss=stats.tokens_per_round_miss, predicted_hit_rate=stats.predicted_hit_rate)
    for key in ("lookup_ms", "backup_ms", "last_build_ms", "build_wait_ms", "build_fan_out_budget"):  # per answer
        if key in draft and draft.get("num_answers"):
            out[f"draft_{key.replace('last_', '')}_per_round"] = draft[key] / draft["num_answers"]
    return out


def summarize(s: BenchSettings, encoded: list[list[int]], timings: list[GroupTiming],
              spec: Counters | None = None) -> dict:
    outputs = [ids for t in timings for ids in t.token_ids]
    num_out = sum(len(ids) for ids in outputs)
    decode_tokens = num_out - len(outputs)  # each sequence's first token belongs to prefill
    decode_s = sum(t.total_s - t.prefill_s for t in timings)
    total_s = sum(t.total_s for t in timings)
    settings = asdict(s)
    settings["tree"] = asdict(s.tree) if s.tree else None
    return {
        **settings,
        "num_prompts": len(encoded),
        "prompt_tokens": sum(len(p) for p in encoded),
        "output_tokens": num_out,
        "decode_tok_s": decode_tokens / decode_s if decode_s > 0 else 0.0,
        "ttft_s": sum(t.prefill_s for t in timings) / len(timings),
        "total_tok_s": num_out / total_s if total_s > 0 else 0.0,
        "total_s": total_s,
        **spec_summary(spec),
        "outputs_sha256": hashlib.sha256(json.dumps(outputs).encode()).hexdigest(),
        "date": time.strftime("%Y-%m-%d"),
    }
