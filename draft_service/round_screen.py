"""A Session round screened on the draft's event loop, before it queues behind model work on the worker thread.

A round past its limits is refused as a whole at once (InvalidRequestError: the stream ends). A sequence that
is bad by itself (tokens, length, temperature, feature metadata, an Outcome for an unknown or expired sequence,
a deadline already passed) is taken out of the round and answered in `errors` at once; the rest of the round goes
to the worker. So a bad message gets its client error code within milliseconds even while the draft builds.
The session's own checks on the worker still run (what needs the tensor's bytes: an unreadable handle).
A round's sequences are stable while it is screened: the servicer awaits each round of a session before reading
its next message, so no worker call of this session mutates `session.seqs` meanwhile (a queued Release may).
"""

from dataclasses import dataclass, field

from draft_service.deadlines import SessionDeadlines
from draft_service.limits import (
    check_feature_rows,
    check_feature_tensor,
    check_prefill_fields,
    check_round,
    check_tokens,
)
from draft_service.session import Session
from protos.ssd.v1 import draft_pb2
from ssd.errors import InvalidRequestError


@dataclass
class Screened:
    round: draft_pb2.Round | None  # what the worker still has to answer; None = nothing (answer `errors` now)
    errors: list[draft_pb2.Error] = field(default_factory=list)  # the refused sequences' answers
    drop: list[int] = field(default_factory=list)  # target seq ids the session must forget (on the worker)


def _check_prefill(p: draft_pb2.Prefill, session: Session) -> None:
    if not p.token_ids:
        raise InvalidRequestError("a Prefill needs its tokens")
    check_prefill_fields(p.token_ids, p.temperature, session.vocab_size, session.limits)
    if session.feature_width and p.HasField("features"):
        check_feature_tensor(p.features, session.feature_width)
        check_feature_rows(p.features.shape[0], p.features_start, len(p.token_ids))


def _check_outcome(o: draft_pb2.Outcome, num_tokens: int | None, session: Session) -> None:
    """`num_tokens`: what the draft holds of the sequence (None: it is prefilled in this very round)."""
    if num_tokens is None:
        return  # the session checks it after applying the Prefill
    if not 0 <= o.num_committed_before <= num_tokens:
        raise InvalidRequestError(f"sequence {o.seq_id}: num_committed_before {o.num_committed_before} "
                                  f"is past the {num_tokens} tokens the draft holds")
    total = o.num_committed_before + len(o.new_token_ids)
    check_tokens(o.new_token_ids, session.vocab_size, session.limits, total)
    if session.feature_width and o.HasField("features"):
        check_feature_tensor(o.features, session.feature_width)
        check_feature_rows(o.features.shape[0], o.features_start, total)


def _refuse(out: Screened, seq_id: int, code: str, message: str, deadlines: SessionDeadlines) -> None:
    out.errors.append(draft_pb2.Error(seq_id=seq_id, code=code, message=message))
    out.drop.append(seq_id)
    deadlines.forget(seq_id)


def screen(round_: draft_pb2.Round, session: Session, deadlines: SessionDeadlines) -> Screened:
    """Check the round on the event loop; raises InvalidRequestError for a round past its limits."""
    check_round(round_, session.limits)
    out = Screened(None, drop=deadlines.due())
    prefills, outcomes = [], []
    for p in round_.prefills:
        time_left = p.time_left_ms if p.HasField("time_left_ms") else None
        try:
            _check_prefill(p, session)
        except InvalidRequestError as e:
            _refuse(out, p.seq_id, "INVALID_ARGUMENT", str(e), deadlines)
            continue
        if time_left is not None and time_left <= 0:
            _refuse(out, p.seq_id, "DEADLINE_EXCEEDED", f"sequence {p.seq_id}: its deadline passed", deadlines)
            continue
        deadlines.start(p.seq_id, time_left)
        prefills.append(p)
    prefilled = {p.seq_id for p in prefills}
    for o in round_.outcomes:
        held = session.seqs.get(o.seq_id)
        if deadlines.is_expired(o.seq_id) and o.seq_id not in prefilled:
            _refuse(out, o.seq_id, "DEADLINE_EXCEEDED", f"sequence {o.seq_id}: its deadline passed", deadlines)
        elif held is None and o.seq_id not in prefilled:
            out.errors.append(draft_pb2.Error(seq_id=o.seq_id, code="NOT_FOUND", message=(
                f"unknown sequence id {o.seq_id} on this session; send a Prefill first")))
        else:
            try:
                _check_outcome(o, None if o.seq_id in prefilled else len(held.token_ids), session)
                outcomes.append(o)
            except InvalidRequestError as e:
                _refuse(out, o.seq_id, "INVALID_ARGUMENT", str(e), deadlines)
    if prefills or outcomes:
        out.round = round_ if len(prefills) + len(outcomes) == len(round_.prefills) + len(round_.outcomes) else \
            _without_refused(round_, prefills, outcomes)
    return out


def _without_refused(round_: draft_pb2.Round, prefills: list[draft_pb2.Prefill],
                     outcomes: list[draft_pb2.Outcome]) -> draft_pb2.Round:
    kept = draft_pb2.Round()
    kept.CopyFrom(round_)
    del kept.prefills[:]
    del kept.outcomes[:]
    kept.prefills.extend(prefills)
    kept.outcomes.extend(outcomes)
    return kept
