"""Time an EAGLE-3 head's chain proposals as SD drafts them: catch up on new positions, then K steps.

    python -m bench.draft_step --k 4 --rounds 40

One sequence whose context grows by `--accepted` + 1 positions a round (as after a verify), random tokens and
random target features (the cost depends on the shapes, not on the values), greedy, one thread by default.
Prints milliseconds per proposal; used for docs/benchmarks.md's attention key-bucket entry. Compare two
commits by running it in each checkout one after the other.
"""

import argparse
import json
import time

import torch

from draft_service.proposers import load_target_embedding
from ssd.model_config import load_model_config
from ssd.model_store import resolve_model
from ssd.speculation.eagle3_proposer import Eagle3Proposer
from ssd.speculation.proposer import ProposeRequest


def time_proposals(target: str, draft: str, k: int, context: int, accepted: int, rounds: int, dtype: str,
                   threads: int) -> dict[str, float]:
    torch.set_num_threads(threads)
    folder = resolve_model(target)
    config = load_model_config(folder)
    proposer = Eagle3Proposer(resolve_model(draft), load_target_embedding(folder), config, dtype)
    width = len(proposer.feature_layers) * config.hidden_size
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(100, 40000, (context,), generator=generator).tolist()

    def propose(start: int) -> None:  # features of positions start.. (the verify's accepted path)
        features = torch.randn(len(tokens) - 1 - start, width, generator=generator)
        proposer.propose([ProposeRequest(1, list(tokens), k, 0.0, generator, None, features, start)])

    propose(0)  # the prompt
    seconds = 0.0
    for _ in range(rounds):
        start = len(tokens) - 1
        tokens.extend(torch.randint(100, 40000, (accepted + 1,), generator=generator).tolist())
        began = time.perf_counter()
        propose(start)
        seconds += time.perf_counter() - began
    return {"k": k, "context": context, "rounds": rounds, "final_context": len(tokens),
            "ms_per_proposal": round(1000 * seconds / rounds, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--draft", default="smollm2-135m-eagle3")
    p.add_argument("--k", type=int, default=4, help="draft tokens per proposal")
    p.add_argument("--context", type=int, default=200, help="prompt tokens")
    p.add_argument("--accepted", type=int, default=1, help="accepted draft tokens per round (context grows by +1)")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    print(json.dumps(time_proposals(args.target, args.draft, args.k, args.context, args.accepted, args.rounds,
                                    args.dtype, args.threads)))


if __name__ == "__main__":
    main()
