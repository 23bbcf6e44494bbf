"""Several choices for one request (OpenAI `n`, `best_of`): independent generations of the same prompt, run
concurrently; with best_of > n, the n candidates with the highest mean token logprob are returned.

Each choice is its own target request (its own id, KV and replica pick), so one request with `n` choices costs
what `n` requests cost. A seeded request gives choice i the seed + i: distinct answers that reproduce. Leaving
early (client gone, an error in one choice) cancels every choice's target call.
"""

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from gateway.generation import TextDelta, TextGenerator, TextRequest
from protos.ssd.v1 import common_pb2


def choice_requests(req: TextRequest, n: int) -> list[TextRequest]:
    if n == 1:
        return [req]
    out = []
    for i in range(n):
        params = common_pb2.SamplingParams()
        params.CopyFrom(req.params)
        if params.HasField("seed"):
            params.seed += i
        out.append(dataclasses.replace(req, params=params, request_id=f"{req.request_id}-{i}"))
    return out


async def complete_all(generator: TextGenerator, reqs: list[TextRequest]) -> list[TextDelta]:
    """Every choice's whole completion, in choice order; the first error cancels the others and is raised."""
    tasks = [asyncio.create_task(generator.complete(r)) for r in reqs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()  # no-op for finished ones
        await asyncio.gather(*tasks, return_exceptions=True)


def mean_logprob(d: TextDelta) -> float:
    """The candidate's log probability per generated token under the target (0.0 for an empty answer)."""
    return sum(lp.logprob for lp in d.logprobs) / len(d.logprobs) if d.logprobs else 0.0


def best_choices(done: list[TextDelta], n: int) -> list[TextDelta]:
    """The n likeliest candidates (mean token logprob), best first; ties keep candidate order."""
    if len(done) == n:
        return done
    ranked = sorted(range(len(done)), key=lambda i: -mean_logprob(done[i]))
    return [done[i] for i in ranked[:n]]


_DONE = object()


async def merged_streams(generator: TextGenerator, reqs: list[TextRequest]) -> AsyncIterator[tuple[int, TextDelta]]:
    """(choice index, delta) from every choice as they come; an error in any choice is raised here.
    Closing this iterator cancels every choice's target call."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=4 * len(reqs))  # bounded: a slow client slows the choices

    async def pump(i: int, req: TextRequest) -> None:
        try:
            async for delta in generator.stream(req):
                await queue.put((i, delta))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, which raises it
            await queue.put((i, e))
        await queue.put((i, _DONE))

    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(reqs)]
    try:
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()  # a choice still streaming leaves its `async for`: its target call is cancelled
        await asyncio.gather(*tasks, return_exceptions=True)


def combined(groups: list[list[TextDelta]]) -> TextDelta:
    """One usage over every prompt's choices (a group per prompt): each prompt once, the completion tokens and
    speculation counters summed."""
    last_deltas = [d for g in groups for d in g]
    first = last_deltas[0]
    specs = [d.spec for d in last_deltas if d.spec is not None]
    spec = None
    if specs:
        spec = common_pb2.SpeculationStats()
        for f in spec.DESCRIPTOR.fields:
            setattr(spec, f.name, sum(getattr(s, f.name) for s in specs))
    return TextDelta("", [], first.finish_reason, sum(g[0].prompt_tokens for g in groups),
                     sum(d.completion_tokens for d in last_deltas), sum(g[0].cached_prompt_tokens for g in groups), spec)
