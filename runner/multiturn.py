"""A multi-turn load: conversations, each turn sent when the answer to the turn before it
has arrived, with the whole history in front of it, as a chat client sends it.

``conversations`` of them are in flight at a time (a new one starts when one ends); a
conversation waits ``think_time_s`` between an answer's end and its next turn. Turn k's
prompt is every earlier user turn and the server's own answer to it, then turn k (joined
by blank lines), so a server with prefix caching finds the whole history in its cache.
The answers the server streams are kept as text for that; everything else is measured
as `loadgen` measures any request, and each record says its conversation and turn.

A turn that fails ends its conversation: the turns it never sent are recorded as failed
("not sent"), so the counts add up and a broken conversation is not a short success. A
server silent for ``idle_timeout_s`` with turns in flight stops the load (`loadgen.IdleWatch`).
Times are seconds from the load's start; ``scheduled_s`` of a turn is when it became due
(its answer before, plus the think time), ``sent_s`` when it was sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from .datasets import BenchRequest, Conversation
from .loadgen import (IDLE_CONNECTION_S, ClientStats, IdleWatch, LoadConfig, RequestRecord, sleep_until, stream_one,
                      watch_idle, watch_loop, write_times)

SEPARATOR = "\n\n"  # between the turns and answers of a history


@dataclass(frozen=True)
class ConversationLoad:
    """A multi-turn repeat's load: its conversations, how many at a time, the think time (s)."""

    conversations: list[Conversation]
    concurrent: int
    think_time_s: float = 0.0

    @property
    def turns(self) -> int:
        return sum(len(c.turns) for c in self.conversations)


def with_history(history: str, turn: BenchRequest, history_tokens: int) -> BenchRequest:
    """The request that sends ``turn`` after ``history`` (``history_tokens`` long, as the
    server counted it; the sum stands for its token count)."""
    if not history:
        return turn
    return BenchRequest(history + SEPARATOR + turn.prompt, history_tokens + turn.prompt_len, turn.output_len)


async def run_conversations(cfg: LoadConfig, conversations: Sequence[Conversation], sink: Callable[[RequestRecord], None],
                            *, concurrent: int, think_time_s: float = 0.0, phase: str = "measure",
                            on_done: Callable[[RequestRecord], None] | None = None,
                            stats: ClientStats | None = None) -> list[RequestRecord]:
    """Run every conversation, ``concurrent`` at a time; every finished turn goes to
    ``sink``. Returns the records in (conversation, turn) order, numbered so."""
    first_index, n = [], 0
    for c in conversations:
        first_index.append(n)
        n += len(c.turns)
    records: list[RequestRecord | None] = [None] * n
    gate = asyncio.Semaphore(concurrent)
    idle = IdleWatch(cfg.idle_timeout_s)
    streaming: set[asyncio.Task] = set()
    id_prefix = cfg.request_id_prefix + ("" if phase == "measure" else f"{phase}-")
    timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=concurrent, keepalive_timeout=IDLE_CONNECTION_S)

    def record(c: Conversation, k: int, req: BenchRequest, due: float) -> RequestRecord:
        i = first_index[c.index] + k
        rec = RequestRecord(i, phase, req.prompt_len, req.output_len, scheduled_s=due, dispatch_s=due,
                            request_id=f"{id_prefix}{i}", conversation=c.index, turn=k + 1)
        records[i] = rec
        return rec

    def finish(rec: RequestRecord) -> None:
        sink(rec)
        if on_done:
            on_done(rec)

    async with aiohttp.ClientSession(timeout=timeout, connector=connector, trace_configs=[write_times()]) as session:
        t0 = time.perf_counter()

        async def converse(c: Conversation) -> None:
            async with gate:
                history, history_tokens, due = "", 0, time.perf_counter() - t0
                for k, turn in enumerate(c.turns):
                    if idle.expired:  # the load was stopped: nothing more is sent (the end records the rest)
                        return
                    req = with_history(history, turn, history_tokens)
                    rec, answer = record(c, k, req, due), []
                    task = asyncio.current_task()
                    streaming.add(task)
                    try:
                        await stream_one(session, cfg, req, rec, t0, idle, text=answer)
                    finally:
                        streaming.discard(task)
                        finish(rec)
                    if rec.status != "ok":
                        for later in range(k + 1, len(c.turns)):
                            skipped = record(c, later, c.turns[later], rec.end_s)
                            skipped.status, skipped.error = "error", f"not sent: turn {k + 1} failed ({rec.error})"
                            skipped.sent_s = skipped.end_s = rec.end_s
                            finish(skipped)
                        return
                    history = req.prompt + SEPARATOR + "".join(answer)
                    history_tokens = (rec.prompt_tokens or req.prompt_len) + (rec.completion_tokens or len(answer))
                    due = rec.end_s + think_time_s
                    await sleep_until(t0, due)

        tasks = [asyncio.create_task(converse(c)) for c in conversations]
        watch = asyncio.create_task(watch_loop(stats)) if stats is not None else None
        watchdog = asyncio.create_task(watch_idle(idle, lambda: [t for t in streaming if not t.done()]))
        try:
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            if not idle.expired:
                raise
        finally:
            pending = [*tasks, watchdog, *([watch] if watch else [])]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    for c in conversations:  # turns the stopped load never reached
        for k, turn in enumerate(c.turns):
            if records[first_index[c.index] + k] is None:
                rec = record(c, k, turn, 0.0)
                rec.status, rec.error = "error", f"not sent: {idle.message() if idle.expired else 'load stopped'}"
                finish(rec)
    return [r for r in records if r is not None]
