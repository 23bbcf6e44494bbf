"""The model card renders from a training summary and an evaluation report."""

from draft_training.model_card import render_model_card


def test_model_card_has_command_and_tables():
    summary = {"train_config": {"batch_tokens": 2048, "lr": 1e-3, "num_unroll": 3, "seed": 0},
               "aux_layers": [2, 15, 27], "draft_vocab_size": 8192, "draft_vocab_coverage": 0.99,
               "train_positions": 1000, "train_sequences": 10, "steps": 5, "train_seconds": 60,
               "validation": [{"val_top1": [0.5, 0.4, 0.3]}]}
    report = {"num_sequences": 2, "num_generated_tokens": 256, "draft_vocab_coverage_heldout": 0.97,
              "chain": {1: {"mean_tokens_per_round": 1.6, "acceptance_per_position": [0.6]}},
              "tree": {"budget": 16, "branching": 2, "mean_tokens_per_round": 2.5},
              "temperature": {"temperature": 0.7, "k": 5, "mean_tokens_per_round": 2.0,
                              "acceptance_per_position": [0.6, 0.5]},
              "by_dataset": {"mtbench": {"k": 5, "mean_tokens_per_round": 2.1}}}
    card = render_model_card("head", "smollm2-135m-instruct", "ssd train-draft --x", summary, report)
    assert "ssd train-draft --x" in card and "| 1 | 1.60 | 0.60 |" in card and "2.50" in card
    assert "unroll of 3 steps" in card and "teacher forcing" not in card

    summary["train_config"]["unroll_warmup_fraction"] = 0.5
    card = render_model_card("head", "smollm2-135m-instruct", "ssd train-draft --x", summary, report)
    assert "first 50% of the budget without the unroll" in card


def test_draft_model_card_names_its_layers_and_has_no_tree_row():
    summary = {"kind": "model", "train_config": {"batch_tokens": 1024, "lr": 5e-4, "seed": 0},
               "init_layers": [0, 10, 19, 29], "draft_vocab_size": 8192, "draft_vocab_coverage": 0.98,
               "train_positions": 1000, "train_sequences": 10, "steps": 5, "train_seconds": 60,
               "validation": [{"val_top1": [0.6]}]}
    report = {"num_sequences": 2, "num_generated_tokens": 256, "draft_vocab_coverage_heldout": 0.97,
              "teacher_forced_top1": 0.6,
              "chain": {1: {"mean_tokens_per_round": 1.6, "acceptance_per_position": [0.6]}},
              "temperature": {"temperature": 0.7, "k": 5, "mean_tokens_per_round": 2.0,
                              "acceptance_per_position": [0.6, 0.5]},
              "by_dataset": {"mtbench": {"k": 5, "mean_tokens_per_round": 2.1}}}
    card = render_model_card("draft4", "smollm2-135m-instruct", "ssd train-draft --kind model", summary, report)
    assert "4 Llama decoder layers" in card and "[0, 10, 19, 29]" in card and "| 1 | 1.60 | 0.60 |" in card
    assert "Token tree" not in card and "unroll" not in card
