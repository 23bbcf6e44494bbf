"""Training EAGLE-3 draft heads by self-distillation: build prompts, let the target answer, capture its features
and next-token distributions on disk, pick a draft vocabulary, train the head, and measure its acceptance.

The held-out benchmark prompts (MT-Bench, HumanEval) are only ever used by evaluation, never for training.
"""
