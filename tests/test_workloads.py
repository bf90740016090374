"""Workloads real servers see: shared prefixes, multi-turn conversations sent on the
answers' clock (against a fake server: a unit test of the client), timed trace replay,
and what their repeats report (TTFT by turn, the prefix-cache hit rate, how the load was
timed). The real vLLM server meets them in test_integration_vllm.py."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from pathlib import Path

import pytest
import yaml

from attnbench.runner.datasets import (BenchRequest, Conversation, DatasetError, multiturn_conversations, shared_prefix, trace_requests)
from attnbench.runner.loadgen import LoadConfig
from attnbench.runner.multiturn import SEPARATOR, run_conversations
from attnbench.runner.recipe import BenchmarkSettings, DatasetSpec, RecipeError, load_suite
from attnbench.runner.summary import RepeatHeader, Witnesses, summarize_repeat
from attnbench.runner.traces import TraceRow, read_trace
from attnbench.runner.workload import Workload
from test_loadgen import _with_server


# --- recipes: one-line errors naming the field ---------------------------------------------

BASE = {"name": "t", "defaults": {"model": {"path": "/m", "served_name": "m"}}}


@pytest.mark.parametrize("benchmark, words", [
    ({"dataset": {"kind": "shared_prefix", "input_len": 8, "output_len": 8}}, ["'shared_prefix' needs 'prefix_len'"]),
    ({"dataset": {"kind": "trace"}}, ["kind 'trace' needs 'path' (the JSONL trace)"]),
    ({"dataset": {"kind": "trace", "path": "t.jsonl", "speedup": 0}}, ["speedup", "greater than 0"]),
    ({"dataset": {"kind": "multiturn", "path": "s.json", "think_time_s": -1}}, ["think_time_s"]),
    ({"dataset": {"kind": "multiturn", "path": "s.json", "conversations": 0}}, ["conversations"]),
    ({"dataset": {"kind": "trace", "path": "t.jsonl"}, "request_rate": 5},
     ["request_rate: dataset kind 'trace' times its requests itself", "leave request_rate out"]),
    ({"dataset": {"kind": "multiturn", "path": "s.json"}, "slo": {"objectives": ["p90 ttft <= 1000 ms"]}, "knee": {}},
     ["knee: dataset kind 'multiturn' times its requests itself"]),
    ({"dataset": {"kind": "sessions"}}, ["dataset.kind", "'shared_prefix', 'multiturn' or 'trace'"]),
    ({"dataset": {"kind": "multiturn"}, "client_processes": 4},
     ["client_processes: a multi-turn load runs in one client process", "got 4"]),
    ({"dataset": {"kind": "multiturn"}, "max_concurrency": 4}, ["max_concurrency", "dataset.conversations"]),
])
def test_bad_workloads_fail_in_one_line_naming_the_field(tmp_path, benchmark, words):
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({**BASE, "runs": [{"name": "a", "benchmark": benchmark}]}))
    with pytest.raises(RecipeError) as info:
        load_suite(path)
    message = str(info.value)
    assert message.startswith(str(path)) and "Traceback" not in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


# --- shared prefixes ------------------------------------------------------------------------

@pytest.mark.parametrize("num_prefixes, prefix_len, suffix_len, n", [(4, 64, 8, 24), (1, 30, 5, 7), (3, 100, 1, 10)])
def test_shared_prefix_prompts_share_exactly_num_prefixes_prefixes(tok, num_prefixes, prefix_len, suffix_len, n):
    requests = shared_prefix(n, tok, 7, num_prefixes, prefix_len, suffix_len, 16)
    assert len(requests) == n and {r.output_len for r in requests} == {16}
    rng = random.Random(7)  # the prefixes as the builder draws them, first
    prefixes = [tok.decode(tok.text_ids(prefix_len, rng)) for _ in range(num_prefixes)]
    groups = Counter(next(i for i, p in enumerate(prefixes) if r.prompt.startswith(p)) for r in requests)
    assert sorted(groups) == list(range(num_prefixes))  # every prompt starts with one of them
    assert sorted(groups.values()) == sorted(Counter(i % num_prefixes for i in range(n)).values())
    assert len({r.prompt for r in requests}) == n  # each with its own suffix
    assert all(abs(r.prompt_len - prefix_len - suffix_len) <= 3 for r in requests)
    again = shared_prefix(n, tok, 7, num_prefixes, prefix_len, suffix_len, 16)
    assert again == requests and shared_prefix(n, tok, 8, num_prefixes, prefix_len, suffix_len, 16) != requests


# --- traces ------------------------------------------------------------------------------

def write_trace(path, rows) -> str:
    path.write_text("".join((json.dumps(r) if not isinstance(r, str) else r) + "\n" for r in rows))
    return str(path)


def test_a_trace_is_read_in_seconds_from_its_first_arrival(tmp_path):
    path = write_trace(tmp_path / "t.jsonl", [
        {"timestamp": 1000, "input_length": 40, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 1250, "input_length": 30, "output_length": 7},
        "",
        {"timestamp": 3000, "input_length": 50, "output_length": 2, "hash_ids": [0, 2, 3]},
        {"timestamp": 9000, "input_length": 9, "output_length": 9}])
    rows = read_trace(path, 3)
    assert rows == [TraceRow(0.0, 40, 5, (0, 1)), TraceRow(0.25, 30, 7), TraceRow(2.0, 50, 2, (0, 2, 3))]


@pytest.mark.parametrize("lines, words", [
    (["{not json"], [":1: not JSON", "one object per line"]),
    (["[1, 2]"], [":1: expected a JSON object, got a JSON list"]),
    ([{"input_length": 4, "output_length": 4}], [":1: 'timestamp' must be a number >= 0, got None"]),
    ([{"timestamp": 0, "input_length": 0, "output_length": 4}], [":1: 'input_length' must be a number >= 1, got 0"]),
    ([{"timestamp": 0, "input_length": 4, "output_length": "8"}], [":1: 'output_length'", "got '8'"]),
    ([{"timestamp": 0, "input_length": 4, "output_length": 4, "hash_ids": [1, "a"]}], [":1: 'hash_ids'"]),
    ([{"timestamp": 5, "input_length": 4, "output_length": 4}, {"timestamp": 4, "input_length": 4, "output_length": 4}],
     [":2: 'timestamp' 4 is before the line above's"]),
    ([{"timestamp": 0, "input_length": 4, "output_length": 4}], ["1 requests, num_prompts asks for 2"]),
])
def test_a_bad_trace_fails_in_one_line_naming_file_and_line(tmp_path, lines, words):
    path = write_trace(tmp_path / "t.jsonl", lines)
    with pytest.raises(ValueError) as info:
        read_trace(path, 2)
    message = str(info.value)
    assert message.startswith(path) and "\n" not in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    with pytest.raises(ValueError, match="trace file not found"):
        read_trace(tmp_path / "none.jsonl", 1)


def test_trace_prompts_share_text_where_they_share_hash_ids(tok):
    rows = [TraceRow(0.0, 70, 3, (5, 6)), TraceRow(0.1, 64, 3, (5, 7)), TraceRow(0.2, 50, 3, (5, 6, 9)),
            TraceRow(0.3, 20, 3)]
    r = trace_requests(rows, tok, 0, block_size=32)
    block5 = tok.decode(tok.text_ids(32, random.Random("0:5")))
    assert all(x.prompt.startswith(block5) for x in r[:3]) and not r[3].prompt.startswith(block5)
    assert r[2].prompt.startswith(tok.decode(tok.text_ids(32, random.Random("0:5"))
                                             + tok.text_ids(32, random.Random("0:6"))[:18]))
    assert all(abs(x.prompt_len - row.input_len) <= 3 for x, row in zip(r, rows))
    assert trace_requests(rows, tok, 1, block_size=32)[0].prompt != r[0].prompt  # another seed, other text


def test_a_trace_workload_is_timed_by_its_timestamps(tmp_path, tiny):
    path = write_trace(tmp_path / "t.jsonl", [{"timestamp": t, "input_length": 12, "output_length": 3}
                                              for t in (500, 700, 1500, 4500)])
    b = BenchmarkSettings(dataset=DatasetSpec(kind="trace", path=path, speedup=2.0), num_prompts=4)
    workload = Workload.of(b, tiny)
    assert workload.offsets(b, float("inf")) == [0.0, 0.1, 0.5, 2.0]
    assert workload.timing(b, b.request_rate) == f"trace: the timestamps of {path}, 2x as fast"
    with pytest.raises(DatasetError, match="4 requests, num_prompts asks for 5"):
        Workload.of(b.model_copy(update={"num_prompts": 5}), tiny)


# --- multi-turn conversations ----------------------------------------------------------------

def write_sharegpt(path, conversations) -> str:
    path.write_text(json.dumps([{"id": str(i), "conversations": [
        {"from": "human" if k % 2 == 0 else "gpt", "value": v} for k, v in enumerate(c)]}
        for i, c in enumerate(conversations)]))
    return str(path)


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega"]) for _ in range(n))


def test_conversations_keep_two_or_more_turns_within_the_limits(tmp_path, tok):
    path = write_sharegpt(tmp_path / "s.json", [
        [words(10, 1), words(20, 2)],  # one turn: not a multi-turn conversation
        [words(10, 3), words(20, 4), words(10, 5), words(20, 6), words(10, 7), words(20, 8)],
        [words(10, 9), words(20, 10), words(300, 11), words(20, 12)],  # turn 2 passes max_total_len
        [words(10, 13), words(20, 14), words(10, 15), words(1, 16)],  # answer 2 under 4 tokens
    ])
    spec = DatasetSpec(kind="multiturn", path=path, max_total_len=200, max_turns=2)
    conversations = multiturn_conversations(spec, 1, tok, 0)
    assert len(conversations) == 1 and len(conversations[0].turns) == 2
    assert conversations[0].turns[0].prompt == words(10, 3)
    assert conversations[0].turns[1].output_len == tok.count(words(20, 6))
    with pytest.raises(DatasetError, match="only 1 conversations have two or more turns within max_total_len 200, "
                                           "2 requested"):
        multiturn_conversations(spec, 2, tok, 0)
    fixed = multiturn_conversations(spec.model_copy(update={"max_turns": 3, "output_len": 5}), 1, tok, 0)
    assert [t.output_len for t in fixed[0].turns] == [5, 5, 5]


@pytest.mark.parametrize("max_turns, max_total_len, output_len", [(2, 2048, None), (6, 2048, None), (8, 600, 32)])
def test_synthetic_conversations_without_a_file(tok, max_turns, max_total_len, output_len):
    spec = DatasetSpec(kind="multiturn", max_turns=max_turns, max_total_len=max_total_len, output_len=output_len,
                       prompt_median=60, output_median=40)
    conversations = multiturn_conversations(spec, 30, tok, 3)
    assert [c.index for c in conversations] == list(range(30))
    lengths = [len(c.turns) for c in conversations]
    assert min(lengths) >= 2 and max(lengths) <= max_turns
    if max_turns > 2 and max_total_len >= 2048:
        assert len(set(lengths)) > 1  # 2 to max_turns turns
    for c in conversations:
        assert sum(t.output_len + t.prompt_len for t in c.turns) <= max_total_len + 4
        if output_len:
            assert {t.output_len for t in c.turns} == {output_len}
    assert multiturn_conversations(spec, 30, tok, 3) == conversations


def conversation(index: int, *texts: str, out: int = 3) -> Conversation:
    return Conversation(index, tuple(BenchRequest(t, 4, out) for t in texts))


def converse(conversations, idle_timeout_s: float = 60.0, **kw):
    records = []

    async def go(url):
        cfg = LoadConfig(url, "m", idle_timeout_s=idle_timeout_s)
        return await run_conversations(cfg, conversations, records.append, **kw)

    fake, returned = asyncio.run(_with_server(go))
    return fake, returned, records


def test_each_turn_carries_the_history_and_waits_for_the_answer_and_think_time():
    talks = [conversation(0, "ok#a1", "ok#a2", "ok#a3"), conversation(1, "ok#b1", "ok#b2")]
    fake, returned, sunk = converse(talks, concurrent=2, think_time_s=0.05)
    assert len(sunk) == len(returned) == 5 and all(r.status == "ok" for r in returned)
    assert [(r.index, r.conversation, r.turn) for r in returned] == [(0, 0, 1), (1, 0, 2), (2, 0, 3), (3, 1, 1), (4, 1, 2)]
    answer = "ttt"  # the fake's answer of 3 tokens
    prompts = [b["prompt"] for b in fake.bodies]
    assert f"ok#a1{SEPARATOR}{answer}{SEPARATOR}ok#a2" in prompts
    assert f"ok#a1{SEPARATOR}{answer}{SEPARATOR}ok#a2{SEPARATOR}{answer}{SEPARATOR}ok#a3" in prompts
    assert f"ok#b1{SEPARATOR}{answer}{SEPARATOR}ok#b2" in prompts
    for before, after in ((returned[0], returned[1]), (returned[1], returned[2]), (returned[3], returned[4])):
        assert after.scheduled_s == pytest.approx(before.end_s + 0.05)
        assert after.sent_s >= before.end_s + 0.05 - 1e-3  # sent after the answer and the think time
    assert returned[1].prompt_len == 5 + 3 + 4  # the server's prompt and answer tokens, then the turn's own
    assert returned[0].sent_s < returned[1].sent_s and returned[3].sent_s < returned[1].sent_s  # both began at once


def test_at_most_concurrent_conversations_are_in_flight():
    talks = [conversation(i, f"slow#{i}a", f"slow#{i}b") for i in range(6)]
    fake, returned, _ = converse(talks, concurrent=2)
    assert fake.max_in_flight <= 2 and all(r.status == "ok" for r in returned) and len(returned) == 12
    by_conversation = {}
    for r in returned:
        by_conversation.setdefault(r.conversation, []).append(r)
    starts = sorted(min(x.sent_s for x in rs) for rs in by_conversation.values())
    ends = sorted(max(x.end_s for x in rs) for rs in by_conversation.values())
    assert starts[2] >= ends[0] - 1e-3  # the third began only when one of the first two ended


def test_a_failed_turn_ends_its_conversation_and_the_rest_are_recorded_failed():
    talks = [conversation(0, "error500#x", "ok#y", "ok#z"), conversation(1, "ok#p", "ok#q")]
    fake, returned, sunk = converse(talks, concurrent=2)
    assert len(sunk) == 5 and [r.status for r in returned] == ["error", "error", "error", "ok", "ok"]
    assert returned[0].error.startswith("HTTP 500") and returned[1].error.startswith("not sent: turn 1 failed (HTTP 500")
    assert len(fake.bodies) == 3  # turns 2 and 3 of the failed conversation never went out
    summary = summarize_repeat(returned, RepeatHeader(run="mt"))
    assert summary.completed == 2 and summary.failed == 3 and summary.status == "degraded"
    assert set(summary.ttft_by_turn) == {"1", "2"} and summary.ttft_by_turn["1"]["completed"] == 1


def test_a_hung_server_stops_the_conversations_and_every_turn_is_accounted_for():
    """The server answers one token and goes silent: the read-idle timeout stops the load;
    the turn in flight timed out, the turns never sent are failed, and the repeat is degraded."""
    talks = [conversation(0, "hang#a", "ok#b"), conversation(1, "ok#c", "ok#d", "ok#e"), conversation(2, "ok#f", "ok#g")]
    _, returned, sunk = converse(talks, idle_timeout_s=0.5, concurrent=2, think_time_s=2.0)
    assert len(returned) == len(sunk) == 7
    by_turn = {(r.conversation, r.turn): r for r in returned}
    assert by_turn[(0, 1)].status == "timeout" and "read-idle timeout" in by_turn[(0, 1)].error
    assert by_turn[(1, 1)].status == "ok"  # answered before the server went silent
    assert all(r.status != "ok" and r.error.startswith("not sent") for k, r in by_turn.items()
               if k not in ((0, 1), (1, 1)))
    summary = summarize_repeat(returned, RepeatHeader(run="mt"))
    assert summary.status == "degraded" and summary.timed_out == 1 and summary.completed == 1


def test_ttft_by_turn_and_the_prefix_cache_hit_rate_in_the_summary():
    talks = [conversation(i, f"ok#{i}a", f"ok#{i}b", f"ok#{i}c") for i in range(4)]
    _, returned, _ = converse(talks, concurrent=4)
    metrics = {"prefix_cache_queries": 400.0, "prefix_cache_hits": 300.0, "requests": 12.0}
    summary = summarize_repeat(returned, RepeatHeader(run="mt", load_timing="closed loop: ..."),
                               witnesses=Witnesses(server_metrics=metrics))
    assert summary.prefix_cache_hit_rate == 0.75 and summary.load_timing == "closed loop: ..."
    assert list(summary.ttft_by_turn) == ["1", "2", "3"]
    for turn, stats in summary.ttft_by_turn.items():
        ttfts = sorted((r.chunk_s[0] - r.sent_s) * 1e3 for r in returned if r.turn == int(turn))
        assert stats["completed"] == 4 and stats["median_ttft_ms"] == pytest.approx((ttfts[1] + ttfts[2]) / 2)
    plain = summarize_repeat(returned, RepeatHeader(), witnesses=Witnesses(server_metrics={"requests": 12.0}))
    assert plain.prefix_cache_hit_rate is None  # no lookups counted: prefix caching off, or no counter
    assert "prefix_cache_hit_rate" not in plain.as_json()


def test_a_multiturn_workload_says_how_it_is_timed(tmp_path, tiny):
    path = write_sharegpt(tmp_path / "s.json", [[words(8, i), words(12, i + 1), words(8, i + 2), words(12, i + 3)]
                                                for i in range(5)])
    b = BenchmarkSettings(dataset=DatasetSpec(kind="multiturn", path=path, conversations=3, think_time_s=0.5),
                          num_prompts=4)
    workload = Workload.of(b, tiny)
    assert workload.size == 8 and len(workload.requests) == 4
    assert workload.timing(b, b.request_rate) == ("closed loop: 4 conversations (8 turns), 3 at a time, each turn "
                                                  "sent 0.5 s after the answer before it")
    assert b.warmup_dataset().kind == "synthetic"  # warm-up prompts are not the conversations' first turns
    poisson = BenchmarkSettings(request_rate=4, num_prompts=10, max_concurrency=3)
    assert Workload([BenchRequest("x", 1, 1)] * 10).timing(poisson, 4.0) == (
        "schedule: Poisson arrivals at 4 req/s (seed 0), at most 3 in flight")


def test_a_sharegpt_file_for_the_suite_gives_conversations_and_leaves_prefixes_and_traces(tmp_path):
    """`attnbench run --sharegpt FILE` (make bench-h100 SHAREGPT=...) over the workloads
    suite: the multi-turn runs take the file's conversations; the shared-prefix runs keep
    their own prompts."""
    suite = load_suite(Path(__file__).resolve().parents[1] / "recipes" / "workloads.yaml").with_sharegpt(tmp_path / "s.json")
    kinds = {r.name: (r.benchmark.dataset.kind, r.benchmark.dataset.path) for r in suite.runs}
    assert kinds["chat-flash"] == ("multiturn", str(tmp_path / "s.json"))
    assert kinds["prefix-on-flash"] == ("shared_prefix", None)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({**BASE, "runs": [
        {"name": "trace", "benchmark": {"dataset": {"kind": "trace", "path": "t.jsonl"}}},
        {"name": "plain", "benchmark": {"dataset": {"kind": "random", "input_len": 8, "output_len": 8}}}]}))
    kinds = {r.name: r.benchmark.dataset.kind for r in load_suite(path).with_sharegpt(tmp_path / "s.json").runs}
    assert kinds == {"trace": "trace", "plain": "sharegpt"}


def test_attnbench_load_sends_each_workload_to_a_running_server(tmp_path, tiny):
    """`attnbench load --dataset shared_prefix | multiturn | trace` against a streaming stub:
    each summary says how its load was timed; the conversations' turns are numbered."""
    from click.testing import CliRunner

    from attnbench.cli import main
    from attnbench.runner.calibrate import StubServer
    from attnbench.runner.store import read_records

    trace = write_trace(tmp_path / "t.jsonl", [{"timestamp": t, "input_length": 20, "output_length": 4, "hash_ids": [1]}
                                               for t in (0, 100, 300)])
    cases = {
        "prefix": (["--dataset", "shared_prefix", "--num-prefixes", "2", "--prefix-len", "16", "--input-len", "4",
                    "--output-len", "4", "--num-prompts", "6", "--request-rate", "50"],
                   "schedule: Poisson arrivals at 50 req/s (seed 0)", 6),
        "chat": (["--dataset", "multiturn", "--num-prompts", "3", "--conversations", "2", "--max-turns", "3",
                  "--output-len", "4", "--think-time", "0.01"], "closed loop: 3 conversations (", None),
        "trace": (["--dataset", "trace", "--dataset-path", trace, "--num-prompts", "3", "--speedup", "2"],
                  f"trace: the timestamps of {trace}, 2x as fast", 3),
    }
    with StubServer() as url:
        for name, (args, timing, count) in cases.items():
            out = tmp_path / name
            result = CliRunner().invoke(main, ["load", "--url", url, "--model", "m", "--tokenizer", str(tiny),
                                               "--out", str(out), *args])
            assert result.exit_code == 0, result.output
            summary = json.loads((out / "summary.json").read_text())
            assert summary["status"] == "ok" and summary["load_timing"].startswith(timing)
            records = read_records(out / "requests.jsonl")
            assert count is None or len(records) == count
    chat = read_records(tmp_path / "chat" / "requests.jsonl")
    assert {r.conversation for r in chat} == {0, 1, 2} and max(r.turn for r in chat) >= 2
    sent = sorted(r.sent_s for r in read_records(tmp_path / "trace" / "requests.jsonl"))
    assert [round(s - sent[0], 2) for s in sent] == [0.0, 0.05, 0.15]
