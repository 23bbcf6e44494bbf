"""MODEL_CARD.md for a trained draft (an EAGLE-3 head, or a draft model: summary kind "model"), rendered from its
training summary and its evaluation report."""

from typing import Any


def _chain_table(report: dict[str, Any]) -> list[str]:
    lines = ["| K | mean tokens / round (accepted + 1) | acceptance at position 1..K (conditional) |",
             "|---|---|---|"]
    for k, s in report["chain"].items():
        rates = " ".join(f"{a:.2f}" for a in s["acceptance_per_position"])
        lines.append(f"| {k} | {s['mean_tokens_per_round']:.2f} | {rates} |")
    return lines


def _unroll(train: dict[str, Any]) -> str:
    full = f"training-time-test unroll of {train['num_unroll']} steps (loss weight 0.8^s)"
    share = train.get("unroll_warmup_fraction", 0.0)
    if not share or train["num_unroll"] == 1:
        return full
    return (f"the first {share:.0%} of the budget without the unroll (teacher forcing), then the {full} from those "
            "weights with a fresh optimizer and schedule")


def _description(target: str, summary: dict[str, Any]) -> str:
    if summary.get("kind") == "model":
        layers = summary.get("init_layers") or []
        return (f"A draft model for `{target}`: {len(layers)} Llama decoder layers initialized from the target's "
                f"layers {layers}, the target's embedding (frozen, not stored: read from the target, checked by "
                f"sha256), and an LM head over a trimmed vocabulary of {summary['draft_vocab_size']} tokens. "
                "Weights bfloat16.")
    return (f"An EAGLE-3 draft head for `{target}`: one decoder layer over the target's features (the residual "
            f"stream entering layers {summary.get('aux_layers')}), the target's embedding (frozen, not stored), and a "
            f"trimmed vocabulary of {summary['draft_vocab_size']} tokens. Weights bfloat16.")


def _objective(summary: dict[str, Any]) -> str:
    if summary.get("kind") == "model":
        return "next-token soft cross-entropy to the target's top-k distribution restricted to the draft vocabulary"
    return (f"{_unroll(summary['train_config'])}; soft cross-entropy to the target's top-k distribution restricted "
            "to the draft vocabulary")


def render_model_card(name: str, target: str, command: str, summary: dict[str, Any], report: dict[str, Any],
                      notes: str = "") -> str:
    tree, temp, train = report.get("tree"), report["temperature"], summary["train_config"]
    last = summary["validation"][-1] if summary["validation"] else {}
    lines = [
        f"# {name}", "", _description(target, summary), "",
        "## How it was made", "", "```", command, "```", "",
        f"- Data: self-distillation. {summary.get('data_description', '')}",
        f"- Positions trained on: {summary['train_positions']} ({summary['train_sequences']} sequences); "
        f"validation: held-back 4% of sequences.",
        f"- Draft vocabulary: {summary['draft_vocab_size']} tokens covering {summary['draft_vocab_coverage']:.1%} "
        f"of the target's stored top-{summary.get('top_k', 16)} probability mass on its own answers "
        f"({report['draft_vocab_coverage_heldout']:.1%} of held-out greedy tokens).",
        f"- Training: {summary['steps']} steps, batch {train['batch_tokens']} positions, AdamW lr {train['lr']}, "
        f"cosine; {_objective(summary)}; seed {train['seed']}.",
        f"- Final validation top-1 agreement{'' if summary.get('kind') == 'model' else ' per unroll step'}: "
        f"{last.get('val_top1')}.",
        f"- Time on this machine (2 shared CPU cores): data {summary.get('data_seconds', '?')} s, "
        f"training {summary['train_seconds']} s, total {summary.get('total_seconds', '?')} s.", "",
        "## Held-out acceptance", "",
        f"Greedy, exact teacher-forced simulation against the target's own greedy continuation "
        f"({report['num_sequences']} prompts: MT-Bench first turns with the chat template + HumanEval raw, "
        f"{report['num_generated_tokens']} generated tokens). Command: "
        f"`ssd eval-draft --target {target} --draft <this folder>`.", "",
        *_chain_table(report), "",
        *([f"- Teacher-forced top-1 at every held-out answer position (true features throughout; compare the "
           f"validation top-1 above): {report['teacher_forced_top1']:.2f}."] if "teacher_forced_top1" in report else []),
        *([f"- Token tree (best-first, top-{tree['branching']} children per node, {tree['budget']} draft tokens): "
           f"**{tree['mean_tokens_per_round']:.2f}** tokens / round (greedy)."] if tree else []),
        f"- Temperature {temp['temperature']}, chain K={temp['k']} (expected, Σ min(p, q) per position along the "
        f"target's path): {temp['mean_tokens_per_round']:.2f} tokens / round; per position "
        f"{' '.join(f'{a:.2f}' for a in temp['acceptance_per_position'])}.",
        *[f"- {n}: chain K={s['k']} {s['mean_tokens_per_round']:.2f} tokens / round"
          for n, s in report["by_dataset"].items()],
        "", notes,
    ]
    return "\n".join(lines) + "\n"
