"""Prompts for the load generator: ShareGPT (first turns, or whole conversations for a
multi-turn load), a synthetic ShareGPT-shaped set, random, shared prefixes, and the
prompts of a replayed trace (runner/traces.py reads the file).

Token counts come from the model's ``tokenizer.json`` through the `tokenizers` library
(no transformers, no torch). Every loader is seeded and returns `BenchRequest`s.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from .recipe import DatasetSpec
from .traces import TraceError, TraceRow, read_trace

# vLLM's ShareGPT filter (benchmarks/datasets: sample_sharegpt_requests)
MIN_TOKENS, MAX_PROMPT, MAX_TOTAL = 4, 1024, 2048


@dataclass(frozen=True)
class BenchRequest:
    prompt: str
    prompt_len: int  # tokens, by the local tokenizer (the server's usage is recorded too)
    output_len: int  # max_tokens asked for


class DatasetError(ValueError):
    pass


class LocalTokenizer:
    """Counts tokens and makes text of a given length with a model's tokenizer.json."""

    def __init__(self, model_dir: str | Path):
        path = Path(model_dir) / "tokenizer.json"
        if not path.exists():
            raise DatasetError(f"{path}: no tokenizer.json; set model.tokenizer to a local folder that has one")
        self._tok = Tokenizer.from_file(str(path))
        special = set()
        for added in json.loads(path.read_text()).get("added_tokens", []):
            if added.get("special"):
                special.add(added["id"])
        self._plain_ids = [i for i in range(self._tok.get_vocab_size()) if i not in special]

    def count(self, text: str, with_special_tokens: bool = False) -> int:
        """Tokens of ``text``; ``with_special_tokens`` adds what the tokenizer's template adds
        (e.g. BOS), as ``tokenizer(text).input_ids`` counts in vLLM's benchmark datasets."""
        return len(self._tok.encode(text, add_special_tokens=with_special_tokens).ids)

    @property
    def special_tokens_added(self) -> int:
        """How many tokens (BOS, ...) the tokenizer's template adds to any text."""
        return self.count("x", with_special_tokens=True) - self.count("x")

    def text_of_length(self, n: int, rng: random.Random) -> str:
        """Random text of about ``n`` tokens (decoded random ids; re-encoding may differ by a few)."""
        return self.decode(self.random_ids(n, rng))

    def random_ids(self, n: int, rng: random.Random) -> list[int]:
        """``n`` random ids of plain (not special) tokens."""
        return [rng.choice(self._plain_ids) for _ in range(n)]

    def text_ids(self, n: int, rng: random.Random) -> list[int]:
        """The ids of random text of ``n`` tokens as the tokenizer splits it (random ids do
        not re-encode to themselves; these do, so pieces of them joined keep their length
        up to a token or two where they meet)."""
        return self._tok.encode(self.text_of_exact_length(n, rng), add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)

    def text_of_exact_length(self, n: int, rng: random.Random) -> str:
        """Random text that re-encodes to ``n`` tokens: drops or adds as many ids as the
        count is off, until it matches (the closest found after 50 tries otherwise)."""
        ids = [rng.choice(self._plain_ids) for _ in range(n)]
        best, best_gap = "", n + 1
        for _ in range(50):
            text = self._tok.decode(ids)
            gap = self.count(text) - n
            if abs(gap) < best_gap:
                best, best_gap = text, abs(gap)
            if gap == 0:
                break
            if gap > 0:
                for _ in range(min(gap, len(ids) - 1)):
                    ids.pop(rng.randrange(len(ids)))
            else:
                ids += [rng.choice(self._plain_ids) for _ in range(-gap)]
        return best


def read_sharegpt(path: str | Path) -> list[tuple[str, str]]:
    """(prompt, completion) of every conversation with at least two turns, in file order;
    a `DatasetError` in one line for a file that is missing, not JSON or holds none."""
    return [(c[0]["value"], c[1]["value"]) for c in _sharegpt_conversations(path)]


def _sharegpt_conversations(path: str | Path) -> list[list]:
    """The ``conversations`` list of every entry with at least two turns, in file order (the
    file parsed once); `DatasetError` as `read_sharegpt` says it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DatasetError(f"{path}: ShareGPT file not found (download ShareGPT_V3_unfiltered_cleaned_split.json "
                           "yourself and point benchmark.dataset.path or --sharegpt at it)") from None
    except IsADirectoryError:
        raise DatasetError(f"{path}: is a folder; expected the ShareGPT JSON file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: not JSON ({e}); expected a ShareGPT JSON list of conversations") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of conversations, got a JSON {type(data).__name__}")
    conversations = [c["conversations"] for c in data if isinstance(c, dict) and len(c.get("conversations", [])) >= 2]
    if not conversations:
        raise DatasetError(f"{path}: no conversation with at least two turns "
                           '(entries like {"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]})')
    return conversations


def load_sharegpt(path: str | Path, num_prompts: int, tokenizer: LocalTokenizer, seed: int,
                  output_len: int | None = None) -> list[BenchRequest]:
    """ShareGPT sampling as `vllm bench serve --dataset-name sharegpt` does it, so that both
    clients send the same requests from one file.

    Conversations with at least two turns; turn 0 is the prompt, turn 1 the completion
    whose token count is the output length (unless ``output_len`` fixes it). Counts are
    vLLM's: ``tokenizer(text).input_ids``, special tokens included (a tokenizer that adds
    BOS makes every count one larger, the output length too: the request asks for
    ``max_tokens`` = completion tokens + 1, as vLLM's client asks). Seeded shuffle (Python's
    ``random`` with ``seed``, as vLLM), then keep pairs with prompt >= 4 and output >= 4
    tokens (the output check skipped when ``output_len`` is fixed), prompt <= 1024 and
    prompt + output <= 2048, until ``num_prompts`` are found.
    """
    pairs = read_sharegpt(path)
    random.Random(seed).shuffle(pairs)
    out = []
    for prompt, completion in pairs:
        p_len = tokenizer.count(prompt, with_special_tokens=True)
        o_len = output_len or tokenizer.count(completion, with_special_tokens=True)
        if not passes_sharegpt_filter(p_len, o_len, check_output=output_len is None):
            continue
        out.append(BenchRequest(prompt, p_len, o_len))
        if len(out) == num_prompts:
            return out
    raise DatasetError(f"{path}: only {len(out)} conversations pass vLLM's ShareGPT filter, {num_prompts} requested")


@dataclass(frozen=True)
class SyntheticShape:
    """Log-normal prompt and output lengths, ShareGPT-like: medians ~220 / ~180 tokens with
    long right tails, clipped by the ShareGPT filter's limits."""

    prompt_median: float
    prompt_sigma: float
    output_median: float
    output_sigma: float
    max_prompt_len: int
    max_total_len: int

    @classmethod
    def of(cls, spec: DatasetSpec) -> "SyntheticShape":
        return cls(spec.prompt_median, spec.prompt_sigma, spec.output_median, spec.output_sigma,
                   spec.max_prompt_len, spec.max_total_len)

    def draw(self, rng: random.Random) -> tuple[int, int]:
        while True:
            p = int(round(rng.lognormvariate(math.log(self.prompt_median), self.prompt_sigma)))
            o = int(round(rng.lognormvariate(math.log(self.output_median), self.output_sigma)))
            if MIN_TOKENS <= p <= self.max_prompt_len and o >= MIN_TOKENS and p + o <= self.max_total_len:
                return p, o


def synthetic_sharegpt(num_prompts: int, tokenizer: LocalTokenizer, seed: int,
                       shape: SyntheticShape, output_len: int | None = None) -> list[BenchRequest]:
    rng = random.Random(seed)
    out = []
    for _ in range(num_prompts):
        p_len, o_len = shape.draw(rng)
        text = tokenizer.text_of_length(p_len, rng)
        out.append(BenchRequest(text, tokenizer.count(text), output_len or o_len))
    return out


def random_fixed(num_prompts: int, tokenizer: LocalTokenizer, seed: int, input_len: int,
                 output_len: int) -> list[BenchRequest]:
    rng = random.Random(seed)
    out = []
    for _ in range(num_prompts):
        text = tokenizer.text_of_length(input_len, rng)
        out.append(BenchRequest(text, tokenizer.count(text), output_len))
    return out


def shared_prefix(num_prompts: int, tokenizer: LocalTokenizer, seed: int, num_prefixes: int, prefix_len: int,
                  suffix_len: int, output_len: int) -> list[BenchRequest]:
    """``num_prompts`` requests over ``num_prefixes`` random prefixes of ``prefix_len``
    tokens, dealt in turn (request i has prefix i mod ``num_prefixes``), each with its own
    random suffix of ``suffix_len`` tokens, then shuffled with ``seed``: a prefix cache
    serves every request but the first of each group from the cache, up to its suffix."""
    rng = random.Random(seed)
    prefixes = [tokenizer.text_ids(prefix_len, rng) for _ in range(num_prefixes)]
    out = []
    for i in range(num_prompts):
        text = tokenizer.decode(prefixes[i % num_prefixes] + tokenizer.text_ids(suffix_len, rng))
        out.append(BenchRequest(text, tokenizer.count(text), output_len))
    rng.shuffle(out)
    return out


def trace_requests(rows: list[TraceRow], tokenizer: LocalTokenizer, seed: int, block_size: int) -> list[BenchRequest]:
    """The prompts of a trace's rows: block k of a row is the first tokens of its
    ``hash_ids[k]``'s block (``block_size`` random tokens drawn once per id with ``seed``),
    as many as the row's ``input_length`` leaves for it; tokens past its blocks are the
    row's own. Equal leading ids give equal leading text, so shared prefixes stay shared."""
    blocks: dict[int, list[int]] = {}
    own = random.Random(seed)
    out = []
    for row in rows:
        ids: list[int] = []
        for h in row.hash_ids:
            if len(ids) >= row.input_len:
                break
            if h not in blocks:
                blocks[h] = tokenizer.text_ids(block_size, random.Random(f"{seed}:{h}"))
            ids += blocks[h][:row.input_len - len(ids)]
        if len(ids) < row.input_len:
            ids += tokenizer.text_ids(row.input_len - len(ids), own)
        text = tokenizer.decode(ids)
        out.append(BenchRequest(text, tokenizer.count(text), row.output_len))
    return out


@dataclass(frozen=True)
class Conversation:
    """The user turns of one multi-turn conversation: each turn's text, its tokens and the
    answer's length (the conversation's own assistant turn; ``output_len`` if fixed)."""

    index: int
    turns: tuple[BenchRequest, ...]


def read_conversations(path: str | Path) -> list[list[tuple[str, str]]]:
    """Every ShareGPT conversation as its (user, assistant) turn pairs, in file order: the
    alternating human/gpt turns from the first (a conversation that starts or goes on
    otherwise is cut there); `DatasetError` as `read_sharegpt` raises it."""
    out = []
    for turns in _sharegpt_conversations(path):
        pairs = []
        for user, answer in zip(turns[::2], turns[1::2]):
            if not (isinstance(user, dict) and isinstance(answer, dict) and user.get("from") == "human"
                    and answer.get("from") == "gpt"):
                break
            pairs.append((str(user.get("value", "")), str(answer.get("value", ""))))
        out.append(pairs)
    return out


def multiturn_conversations(spec: DatasetSpec, count: int, tokenizer: LocalTokenizer, seed: int) -> list[Conversation]:
    """``count`` conversations of at least two turns from ``spec.path``, in a seeded random
    order: at most ``spec.max_turns`` turns each, cut before the first turn whose history
    (every earlier turn and answer) plus itself and its answer would pass
    ``spec.max_total_len`` tokens; a turn shorter than 1 token, or an answer shorter than
    `MIN_TOKENS`, ends the conversation too."""
    if spec.path is None:
        return synthetic_conversations(spec, count, tokenizer, seed)
    conversations = [c for c in read_conversations(spec.path) if len(c) >= 2]
    random.Random(seed).shuffle(conversations)
    out: list[Conversation] = []
    for pairs in conversations:
        turns, context = [], 0
        for user, answer in pairs[:spec.max_turns]:
            u_len = tokenizer.count(user)
            o_len = spec.output_len or tokenizer.count(answer)
            if u_len < 1 or o_len < MIN_TOKENS or context + u_len + o_len > spec.max_total_len:
                break
            turns.append(BenchRequest(user, u_len, o_len))
            context += u_len + o_len
        if len(turns) >= 2:
            out.append(Conversation(len(out), tuple(turns)))
        if len(out) == count:
            return out
    raise DatasetError(f"{spec.path}: only {len(out)} conversations have two or more turns within "
                       f"max_total_len {spec.max_total_len}, {count} requested (num_prompts)")


def synthetic_conversations(spec: DatasetSpec, count: int, tokenizer: LocalTokenizer, seed: int) -> list[Conversation]:
    """``count`` conversations of 2 to ``spec.max_turns`` turns (uniform), each turn's and
    answer's lengths drawn as the synthetic kind draws a prompt's and an output's (with
    ``output_len`` fixing the answers), random text; the turns stop before one that would
    take the history past ``spec.max_total_len`` tokens (and there are always two)."""
    rng, shape = random.Random(seed), SyntheticShape.of(spec)
    out = []
    for index in range(count):
        turns, context, wanted = [], 0, rng.randint(2, max(2, spec.max_turns))
        while len(turns) < wanted:
            p_len, o_len = shape.draw(rng)
            o_len = spec.output_len or o_len
            if context + p_len + o_len > spec.max_total_len:
                if len(turns) >= 2:
                    break
                p_len, o_len = MIN_TOKENS, spec.output_len or MIN_TOKENS  # two short turns still fit
            text = tokenizer.text_of_exact_length(p_len, rng)
            turns.append(BenchRequest(text, tokenizer.count(text), o_len))
            context += turns[-1].prompt_len + o_len
        out.append(Conversation(index, tuple(turns)))
    return out


def check_dataset(spec: DatasetSpec, num_prompts: int | None = None) -> None:
    """What can be checked before a server starts: a ShareGPT file exists, is JSON and
    holds conversations, a trace's lines (``num_prompts`` of them) are well formed
    (`DatasetError` otherwise). Token counts need the tokenizer."""
    if spec.kind == "sharegpt" or (spec.kind == "multiturn" and spec.path):
        read_sharegpt(spec.path)
    elif spec.kind == "trace":
        trace_rows(spec, num_prompts or 1)


def trace_rows(spec: DatasetSpec, count: int) -> list[TraceRow]:
    """`traces.read_trace`, its errors as `DatasetError`."""
    try:
        return read_trace(spec.path, count)
    except TraceError as e:
        raise DatasetError(str(e)) from None


def build_requests(spec: DatasetSpec, num_prompts: int, tokenizer_dir: str | Path, seed: int) -> list[BenchRequest]:
    """The requests of one repeat, as a recipe's dataset describes them (of a multi-turn
    set: each conversation's first turn; `multiturn_conversations` has the whole)."""
    tok = LocalTokenizer(tokenizer_dir)
    if spec.kind == "sharegpt":
        return load_sharegpt(spec.path, num_prompts, tok, seed, spec.output_len)
    if spec.kind == "synthetic":
        return synthetic_sharegpt(num_prompts, tok, seed, SyntheticShape.of(spec), spec.output_len)
    if spec.kind == "shared_prefix":
        return shared_prefix(num_prompts, tok, seed, spec.num_prefixes, spec.prefix_len, spec.input_len,
                             spec.output_len)
    if spec.kind == "trace":
        return trace_requests(trace_rows(spec, num_prompts), tok, seed, spec.block_size)
    if spec.kind == "multiturn":  # each conversation's first turn (a warm-up's requests)
        return [c.turns[0] for c in multiturn_conversations(spec, num_prompts, tok, seed)]
    return random_fixed(num_prompts, tok, seed, spec.input_len, spec.output_len)


def passes_sharegpt_filter(prompt_len: int, output_len: int, check_output: bool = True) -> bool:
    """vLLM's ShareGPT filter on token counts (its ``is_valid_sequence``); the minimum
    output length is not checked when the output length is fixed."""
    short_output = check_output and output_len < MIN_TOKENS
    return (prompt_len >= MIN_TOKENS and not short_output and prompt_len <= MAX_PROMPT
            and prompt_len + output_len <= MAX_TOTAL)


def to_sharegpt(requests: list[BenchRequest], tokenizer: LocalTokenizer, seed: int,
                limit: int | None = None) -> list[dict]:
    """``requests`` as ShareGPT conversations (human prompt, then a gpt turn of random text
    whose vLLM-style count, special tokens included, is ``output_len``), so that tools
    which read ShareGPT (`vllm bench serve --dataset-name sharegpt`, `attnbench load
    --dataset sharegpt`) send the same prompts with the same ``max_tokens`` as the
    requests themselves. Requests the ShareGPT filter drops and gpt turns that miss their
    length are left out; at most ``limit`` conversations."""
    rng = random.Random(seed)
    added = tokenizer.special_tokens_added
    out: list[dict] = []
    for r in requests:
        if limit is not None and len(out) == limit:
            break
        if r.output_len <= added or not passes_sharegpt_filter(
                tokenizer.count(r.prompt, with_special_tokens=True), r.output_len):
            continue
        completion = tokenizer.text_of_exact_length(r.output_len - added, rng)
        if tokenizer.count(completion, with_special_tokens=True) != r.output_len:
            continue
        out.append({"id": f"attnbench-{len(out)}",
                    "conversations": [{"from": "human", "value": r.prompt},
                                      {"from": "gpt", "value": completion}]})
    return out
