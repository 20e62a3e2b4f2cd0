"""Plain-text tables: a header row and left-aligned columns, two spaces apart (pure)."""

from __future__ import annotations

from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """``rows`` under ``headers``, each column as wide as its widest cell; None shows as "-"."""
    cells = [[str(h) for h in headers], *[["-" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]
    return "\n".join(lines)
