"""The exact distribution of a tiny model's first generated tokens, and a chi-square test against samples."""

import itertools
from collections import Counter

import torch
from scipy.stats import chi2


def joint_distribution(hf_model, prompt: list[int], temperature: float, num_tokens: int = 3,
                       presence: float = 0.0, frequency: float = 0.0, repetition: float = 1.0,
                       min_p: float = 0.0) -> dict[tuple, float]:
    """P(t1..tn | prompt) for every token tuple, by exhaustive batched forwards in float64; `presence` and
    `frequency` penalize the tokens already generated (OpenAI semantics), `repetition` those of the prompt and
    the answer (HF semantics); `min_p` drops tokens below min_p x the likeliest."""
    vocab = hf_model.config.vocab_size
    probs: dict[tuple, float] = {(): 1.0}
    for depth in range(num_tokens):
        prefixes = list(itertools.product(range(vocab), repeat=depth))
        ids = torch.tensor([prompt + list(p) for p in prefixes])
        with torch.no_grad():
            logits = hf_model(ids).logits[:, -1].double()  # [N, V]
        counts = torch.zeros_like(logits)  # [N, V]: generated tokens so far
        for i, p in enumerate(prefixes):
            for t in p:
                counts[i, t] += 1
        seen = counts > 0
        seen[:, prompt] = True
        logits = torch.where(seen, torch.where(logits > 0, logits / repetition, logits * repetition), logits)
        logits = logits - frequency * counts - presence * (counts > 0).double()
        step = torch.softmax(logits / temperature, dim=-1)
        step = step.masked_fill(step < min_p * step.max(dim=-1, keepdim=True).values, 0.0)
        step = step / step.sum(dim=-1, keepdim=True)
        probs = {p + (t,): probs[p] * float(step[i, t]) for i, p in enumerate(prefixes) for t in range(vocab)}
    return probs


def chi_square_pvalue(samples: list[tuple], exact: dict[tuple, float], min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit; cells expected below `min_expected` are pooled into one."""
    n = len(samples)
    counts = Counter(samples)
    stat, dof = 0.0, -1
    pooled_obs, pooled_exp = 0, 0.0
    for cell, p in exact.items():
        expected = n * p
        if expected >= min_expected:
            stat += (counts.get(cell, 0) - expected) ** 2 / expected
            dof += 1
        else:
            pooled_obs += counts.get(cell, 0)
            pooled_exp += expected
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        dof += 1
    return float(chi2.sf(stat, dof))


def tiny_target_and_draft(tmp_path_factory):  # noqa: ANN001, ANN201 - shared by the chi-square test modules
    """(target folder, draft folder, the target as a float64 HF model): a 16-token vocabulary, so exact joint
    distributions stay small; the draft has other weights and one layer."""
    from tests.tiny_models import write_tiny_checkpoint

    target, draft = tmp_path_factory.mktemp("t"), tmp_path_factory.mktemp("d")
    hf = write_tiny_checkpoint(target, "llama", seed=0, vocab_size=16, initializer_range=0.3)
    write_tiny_checkpoint(draft, "llama", seed=5, vocab_size=16, num_hidden_layers=1, initializer_range=0.3)
    return target, draft, hf.double()
