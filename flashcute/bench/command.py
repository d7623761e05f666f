"""What the commands that time kernels on the benchmark's grid share (`flashcute bench`, `compare`, `tune`,
`power`): the grid's flags, parsed without loading torch so that --help and a malformed flag answer at once, and
the refusal on a machine without a GPU."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import TypeVar

from flashcute.bench.grid import DTYPES, HIDDEN, TOKENS, DecodeSpec, GridSpec, VarlenSpec, seqlen_label

T = TypeVar("T")
Spec = TypeVar("Spec", GridSpec, VarlenSpec, DecodeSpec)
BOOLS = {"no": False, "false": False, "0": False, "yes": True, "true": True, "1": True}


def comma_list(parse_item: Callable[[str], T], unique: bool = True) -> Callable[[str], tuple[T, ...]]:
    """An argparse type for "a,b,c": each item parsed, order kept, duplicates dropped unless not ``unique`` (a list
    paired item by item with another keeps them)."""

    def parse(text: str) -> tuple[T, ...]:
        try:
            items = tuple(parse_item(item.strip()) for item in text.split(",") if item.strip())
            items = tuple(dict.fromkeys(items)) if unique else items
        except (KeyError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc
        if not items:
            raise argparse.ArgumentTypeError(f"{text!r} names nothing")
        return items

    return parse


def parse_dtype(text: str) -> str:
    if text not in DTYPES:
        raise ValueError(f"dtype {text!r} is not one of {', '.join(DTYPES)}")
    return text


def parse_size(text: str) -> int:
    """A positive int, with k for 1024: "4k" -> 4096."""
    value = int(text[:-1]) * 1024 if text.lower().endswith("k") else int(text)
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive size")
    return value


def parse_causal(text: str) -> bool:
    if text.lower() not in BOOLS:
        raise ValueError(f"causal {text!r} is not one of {', '.join(BOOLS)}")
    return BOOLS[text.lower()]


def add_grid_arguments(
    parser: argparse.ArgumentParser, default: GridSpec, title: str = "grid (each flag narrows or overrides its default)"
) -> argparse._ArgumentGroup:
    """--dtype, --headdim, --causal, --seqlen, --batch and --nheads, their help showing ``default``; returns the
    group, for a command's own grid flags."""
    masks = ",".join("yes" if causal else "no" for causal in default.causals)
    batch = default.batch or f"{TOKENS} // seqlen"
    nheads = default.nheads or f"{HIDDEN} // headdim"
    grid = parser.add_argument_group(title)
    grid.add_argument(
        "--dtype", type=comma_list(parse_dtype), help=f"comma list of bf16, fp16 (default: {','.join(default.dtypes)})"
    )
    grid.add_argument(
        "--headdim",
        type=comma_list(parse_size, unique=False),
        help=f"comma list (default: {','.join(map(str, default.headdims))})",
    )
    grid.add_argument("--causal", type=comma_list(parse_causal), help=f"comma list of no, yes (default: {masks})")
    grid.add_argument(
        "--seqlen",
        type=comma_list(parse_size),
        help=f"comma list, k = 1024 (default: {','.join(map(seqlen_label, default.seqlens))})",
    )
    grid.add_argument("--batch", type=parse_size, help=f"batch for every seqlen (default: {batch})")
    grid.add_argument("--nheads", type=parse_size, help=f"heads for every headdim (default: {nheads})")
    return grid


def grid_from_flags(args: argparse.Namespace, default: Spec) -> Spec:
    """``default`` with the grid flags that were given (a VarlenSpec takes no --seqlen or --batch, a DecodeSpec
    neither, nor --nheads). --headdim keeps a repeated head dim only to pair it with another v head dim (a list of
    --headdim-v)."""
    headdims = args.headdim
    if headdims is not None and len(getattr(args, "headdim_v", None) or ()) <= 1:
        headdims = tuple(dict.fromkeys(headdims))
    flags = {
        "dtypes": args.dtype,
        "headdims": headdims,
        "causals": args.causal,
        "seqlens": args.seqlen,
        "batch": args.batch,
        "nheads": args.nheads,
    }
    return dataclasses.replace(default, **{name: value for name, value in flags.items() if value is not None})


def add_family_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """--kernel: one kernel family by name, the registry's fastest by default; ``what`` says what it chooses."""
    from flashcute.kernels import registry

    parser.add_argument(
        "--kernel", choices=registry.FAMILIES, default=registry.FAMILIES[0], help=f"{what} (default: %(default)s)"
    )


def add_timing_arguments(parser: argparse.ArgumentParser, rounds: int) -> None:
    """--rounds (default ``rounds``) and --no-check, as bench.runner.Settings takes them."""
    parser.add_argument(
        "--rounds",
        type=parse_size,
        default=rounds,
        help="time the backends of a shape this many times, in turn (each round in another order, every backend "
        f"after every other), and keep each one's median (default: {rounds})",
    )
    parser.add_argument("--no-check", action="store_true", help="skip the correctness check against float64")


def no_gpu(command: str) -> bool:
    """True, after saying so on stderr, where torch sees no CUDA GPU (the command then exits with status 2)."""
    import torch

    if torch.cuda.is_available():
        return False
    print(
        f"flashcute {command}: no CUDA GPU here (torch {torch.__version__} reports torch.cuda.is_available() == "
        "False). It runs GPU kernels; run it on a machine with an NVIDIA GPU.",
        file=sys.stderr,
    )
    return True
