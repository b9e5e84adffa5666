"""The ``blocks data`` command group: ``blocks data prepare SOURCE OUT``."""

from __future__ import annotations

import argparse
import os
from typing import Any

from rich.console import Console
from rich.markup import escape


def add_data_parser(sub: Any) -> None:
    """Add ``data prepare`` to the subcommands of ``blocks``."""
    data = sub.add_parser("data", help="prepare token shards for data=stream")
    commands = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    prep = commands.add_parser(
        "prepare", help="tokenize text, JSON Lines or Parquet files into shards and a manifest (resumable)"
    )
    prep.add_argument(
        "source", help="a file, directory, glob or fsspec URL; python:email for the stdlib corpus"
    )
    prep.add_argument("out", help="the shard directory to write (fsspec URL, e.g. s3://bucket/shards)")
    prep.add_argument(
        "--tokenizer",
        default="byte",
        help="byte (default), bpe:VOCAB (trained on SOURCE) or the path of a tokenizer.json",
    )
    prep.add_argument(
        "--val-fraction", type=float, default=0.1, help="share of each source held out (default 0.1)"
    )
    prep.add_argument("--shard-tokens", type=int, default=1 << 24, help="most tokens per shard file")
    prep.add_argument("--text-key", default="text", help="the text field of JSON Lines and Parquet rows")
    prep.add_argument(
        "--workers",
        type=int,
        default=min(8, os.cpu_count() or 1),
        help="worker processes (default: CPUs, ≤ 8)",
    )


def cmd_data(args: argparse.Namespace) -> int:
    """Run ``blocks data prepare``; print the manifest's numbers."""
    from blocks.data.shards.prepare import PrepareOptions, prepare
    from blocks.spec.errors import BlocksError, Problem

    if not 0 <= args.val_fraction < 1:
        raise BlocksError(
            Problem("--val-fraction", f"{args.val_fraction} is outside [0, 1)", "--val-fraction 0.1")
        )
    if args.shard_tokens <= 0 or args.workers <= 0:
        raise BlocksError(
            Problem("--shard-tokens", "sizes must be positive", "--shard-tokens 16777216 --workers 2")
        )
    options = PrepareOptions(
        tokenizer=args.tokenizer,
        val_fraction=args.val_fraction,
        shard_tokens=args.shard_tokens,
        text_key=args.text_key,
        workers=args.workers,
    )
    manifest = prepare(args.source, args.out, options)
    Console().print(
        f"prepared {escape(args.out)}: {len(manifest.sources)} sources, {manifest.documents:,} documents, "
        f"{manifest.tokens('train'):,} train + {manifest.tokens('val'):,} val tokens, "
        f"vocabulary {manifest.vocab_size:,} ({escape(manifest.tokenizer)})",
        highlight=False,
    )
    return 0
