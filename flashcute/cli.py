"""`flashcute demo | walkthrough | bench | check | warmup | cache | compare | tune | sanitize | power |
flash-attn-tests`: the command line.

Each command lives in its own module with ``add_arguments(parser)`` and ``run(args) -> int``; only the module of
the command being run is imported, so `flashcute --help` answers without loading torch or CuTe DSL.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# command -> (module with add_arguments / run, one-line summary)
COMMANDS = {
    "demo": (
        "flashcute.demo",
        "flashcute against PyTorch SDPA on an LLM-sized problem (errors, TFLOP/s); without a GPU, the CPU model",
    ),
    "walkthrough": ("flashcute.walkthrough", "the seed article's worked example, round by round, on the CPU"),
    "bench": ("flashcute.bench.cli", "the benchmark sweep against SDPA, FlexAttention, flash-attn-4 (needs a GPU)"),
    "check": ("flashcute.check", "compile every kernel variant without a GPU; report registers, spills, SASS"),
    "warmup": (
        "flashcute.tools.warmup",
        "compile kernels into the disk cache ahead of time (default: what a typical LLM uses on this GPU)",
    ),
    "cache": ("flashcute.tools.cache", "where the compiled-kernel cache is, its size and entries; --clear empties it"),
    "compare": (
        "flashcute.tools.compare",
        "this checkout's kernels against an earlier commit's, timed side by side in one process (run: needs a GPU)",
    ),
    "tune": (
        "flashcute.tools.tune",
        "a family's heuristic forward config against the same config with fields overridden (needs a GPU)",
    ),
    "sanitize": (
        "flashcute.tools.sanitize",
        "compute-sanitizer memcheck, racecheck and synccheck over every kind of kernel (needs a GPU)",
    ),
    "power": ("flashcute.tools.power", "TFLOP/s, W, MHz and joules a PFLOP in sustained loops (needs a GPU)"),
    "flash-attn-tests": (
        "flashcute.tools.flash_attn_tests",
        "flash-attention 2's own tests (its test_flash_attn.py) run against flashcute (needs a GPU)",
    ),
}


def _parser(command: str | None) -> argparse.ArgumentParser:
    """The parser, with the options of ``command`` only (building the others would import their modules)."""
    from flashcute import __version__

    parser = argparse.ArgumentParser(prog="flashcute", description="FlashAttention for PyTorch, in CuTe DSL.")
    parser.add_argument("--version", action="version", version=f"flashcute {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, summary) in COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        if name == command:
            importlib.import_module(module).add_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((arg for arg in argv if arg in COMMANDS), None)
    args = _parser(command).parse_args(argv)
    return importlib.import_module(COMMANDS[args.command][0]).run(args)


if __name__ == "__main__":
    raise SystemExit(main())
