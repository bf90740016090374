"""Shrink a cross-check tree (cross-check.sh's output) to what the repository keeps.

    python3 archive_cross_check.py SRC_DIR DEST_DIR [--no-records]

Keeps every summary, /metrics page, CPU record and comparison.md; the per-request records
of the first repeat of each client and load (attnbench's requests.jsonl.gz, vllm bench
serve's --save-detailed JSON); of the other repeats only the chunk count each client saw
the order the server answered in and, where the sends were traced (sent/, kept whole), TTFT
counted from the write (attnbench: ``chunks.txt``, ``order.txt``, ``wire.json``; vllm
bench: ``chunks``, ``order`` and ``wire`` fields in its summary JSON), which is what
compare_clients.py reads from an archived copy. Text is gzipped; prompts.json is left out
(`attnbench dataset export --seed 0` writes it again), and so are its halves of a
side-by-side campaign (prompts-a.json, prompts-b.json: its even- and odd-numbered prompts). ``--no-records`` keeps no
per-request records at all, r1's neither (for trees kept as evidence beside the current
one; it also shrinks an archived tree).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path

from compare_clients import (attnbench_chunks, attnbench_first_token_order, attnbench_wire, text_of,
                             vllm_bench_chunks, vllm_bench_first_token_order, vllm_bench_wire)

DETAIL = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors")


def _gzip_to(text: str, dest: Path) -> None:
    dest.with_name(dest.name.removesuffix(".gz") + ".gz").write_bytes(gzip.compress(text.encode(), mtime=0))


def archive(src: Path, dest: Path, records: bool = True) -> None:
    def _keep_records(run: str) -> bool:
        return records and run in ("r1", "r1.json")

    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src)
        name = rel.name.removesuffix(".gz")
        if name.startswith("prompts") and name.endswith(".json"):  # prompts.json and its halves
            continue
        (dest / rel.parent).mkdir(parents=True, exist_ok=True)
        if name == "requests.jsonl":
            text = text_of(path)
            if _keep_records(rel.parent.name):
                _gzip_to(text, dest / rel)
            else:  # only the chunk count and the answer order compare_clients.py reads
                (dest / rel.parent / "chunks.txt").write_text(f"{attnbench_chunks(text)}\n")
                if (order := attnbench_first_token_order(text)) is not None:
                    (dest / rel.parent / "order.txt").write_text(f"{order}\n")
                run = path.parent  # LOAD/CLIENT/rN (a load's warm-up has no repeat number and no trace)
                if run.name[1:].isdigit() and (wire := attnbench_wire(run.parent.parent, run.parent.name,
                                                                      int(run.name[1:]), text)) is not None:
                    (dest / rel.parent / "wire.json").write_text(json.dumps(wire))
        elif rel.parent.name == "vllm-bench" and name.endswith(".json"):
            result = json.loads(text_of(path))
            if _keep_records(name):
                _gzip_to(json.dumps(result), dest / rel)
            else:
                if "itls" in result:  # not yet archived
                    result["chunks"] = vllm_bench_chunks(result)
                    result["order"] = vllm_bench_first_token_order(result)
                    result["wire"] = vllm_bench_wire(path.parent.parent, int(name.split(".")[0][1:]), result)
                (dest / rel.parent / name).write_text(json.dumps({k: v for k, v in result.items() if k not in DETAIL}))
        elif name.endswith((".prom", ".log", ".jsonl")):  # scrapes, logs, send traces
            _gzip_to(text_of(path), dest / rel)
        else:
            shutil.copyfile(path, dest / rel)


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("src", type=Path)
    cli.add_argument("dest", type=Path)
    cli.add_argument("--no-records", action="store_true", help="keep no per-request records, r1's neither")
    args = cli.parse_args()
    archive(args.src, args.dest, records=not args.no_records)
