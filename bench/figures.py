"""The figures a benchmark hands to `make bench` (bench/run_all.py), next to its printed report.

A script given `--json PATH` writes there a JSON list of {figure, goal, value, baseline}: the
figure's name, the goal it is held to ("" when none), what this run measured, and a baseline
measured in the same run ("" when there is none). The file is rewritten after every figure, so
a script that fails or is stopped half-way still leaves what it did measure.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Figure:
    figure: str
    goal: str
    value: str
    baseline: str = ""


class FigureLog:
    """Collects a run's figures; with a path, keeps them written there as JSON."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.figures: list[Figure] = []
        self._write()

    def add(self, figure: str, goal: str, value: str, baseline: str = "") -> None:
        self.figures.append(Figure(figure, goal, value, baseline))
        self._write()

    def _write(self) -> None:
        if self.path is not None:
            rows = [asdict(f) for f in self.figures]
            self.path.write_text(json.dumps(rows, indent=2) + "\n")


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="also write the figures to PATH as a JSON list of {figure, goal, value, baseline}",
    )


def p50_p99(samples: Sequence[float]) -> tuple[float, float]:
    """Median and 99th percentile (nearest rank) of `samples`."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered), p99


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds * 1e3:,.0f} ms"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} us" if seconds < 1e-3 else f"{seconds * 1e6:,.0f} us"
