"""Re-scores lm-evaluation-harness log-likelihood samples with HF transformers in float32 (an independent
reference for the bridge's `echo` + `logprobs` path) and prints the largest difference and both accuracies.

    python bench/lm_eval/check_loglik.py --model smollm2-135m-instruct --samples OUT/.../samples_ssd_arith_mc_*.jsonl
"""

import argparse
import json
from pathlib import Path

import torch


def _encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:  # noqa: ANN001
    """As the harness splits a request: trailing spaces move to the continuation; the continuation's tokens are
    those of the whole text past the context's."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    context_ids = tokenizer.encode(context, add_special_tokens=False)
    return context_ids, whole[len(context_ids):]


@torch.inference_mode()
def _loglikelihood(model, context: list[int], continuation: list[int]) -> float:  # noqa: ANN001
    ids = torch.tensor([context + continuation])  # [1, n]
    logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)  # [n-1, V]: row i predicts token i+1
    rows = torch.arange(len(context) - 1, ids.shape[1] - 1)
    return float(logprobs[rows, ids[0, rows + 1]].sum())


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ssd.model_store import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--samples", type=Path, required=True, help="a samples_*.jsonl file of `lm_eval --log_samples`")
    args = parser.parse_args()
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    worst, right_bridge, right_hf, n = 0.0, 0, 0, 0
    for line in args.samples.read_text().splitlines():
        sample = json.loads(line)
        bridge = [float(r[0][0]) for r in sample["resps"]]  # one (loglikelihood, is_greedy) per choice
        pairs = [(a["arg_0"], a["arg_1"]) for a in sample["arguments"].values()]  # (context, continuation)
        ours = [_loglikelihood(model, *_encode_pair(tokenizer, *pair)) for pair in pairs]
        worst = max(worst, *(abs(a - b) for a, b in zip(bridge, ours, strict=True)))
        target = int(sample["target"])
        right_bridge += max(range(len(bridge)), key=bridge.__getitem__) == target
        right_hf += max(range(len(ours)), key=ours.__getitem__) == target
        n += 1
    print(json.dumps({"docs": n, "max_abs_loglikelihood_diff": worst, "acc_bridge": right_bridge / n,
                      "acc_hf_float32": right_hf / n}))


if __name__ == "__main__":
    main()
