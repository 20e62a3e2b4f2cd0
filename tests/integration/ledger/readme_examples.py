"""The README's example queries of the ledger ("Accounting in the ledger"), read from the README itself:
each ```sql block and the output block after it. test_readme_examples.py runs them on the ledger's schema,
and ``python tests/integration/ledger/readme_examples.py DSN`` prints them, run on that database, in the
README's layout (how the README's outputs were made, from a ``make run`` database)."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import asyncpg

README = Path(__file__).resolve().parents[3] / "README.md"
SECTION = "## Accounting in the ledger"
_BLOCK = re.compile(r"```sql\n(?P<query>.*?)\n```\n```\n(?P<output>.*?)\n```", re.DOTALL)


@dataclass(frozen=True)
class Example:
    query: str
    columns: tuple[str, ...]
    """The output's header, as the README shows it."""
    rows: tuple[tuple[str, ...], ...]
    """The output's rows, cell by cell, as the README shows them."""


def examples(readme: Path = README) -> list[Example]:
    """The section's examples, in order."""
    text = readme.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end >= 0 else len(text)]
    found = []
    for match in _BLOCK.finditer(section):
        header, *lines = match["output"].splitlines()
        found.append(
            Example(
                query=match["query"],
                columns=_cells(header),
                rows=tuple(_cells(line) for line in lines),
            )
        )
    return found


def _cells(line: str) -> tuple[str, ...]:
    return tuple(cell.strip() for cell in line.split("|"))


def render(columns: Sequence[str], rows: Sequence[Mapping[str, object]]) -> str:
    """Rows in the README's layout: ``|`` between columns, text left and numbers right, no rule, no footer."""
    cells = [[_text(row[c]) for c in columns] for row in rows]
    numeric = [
        all(isinstance(row[c], int | float | Decimal) for row in rows if row[c] is not None) for c in columns
    ]
    widths = [max([len(c), *(len(line[k]) for line in cells)]) for k, c in enumerate(columns)]

    def line(values: Sequence[str], header: bool = False) -> str:
        out = [
            v.rjust(w) if numeric[k] and not header else v.ljust(w)
            for k, (v, w) in enumerate(zip(values, widths, strict=True))
        ]
        return " | ".join(out).rstrip()

    return "\n".join([line(columns, header=True), *(line(values) for values in cells)])


def _text(value: object) -> str:
    return "" if value is None else str(value)


async def _main(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for example in examples():
            statement = await conn.prepare(example.query)
            columns = [a.name for a in statement.get_attributes()]
            rows = await statement.fetch()
            print(f"```sql\n{example.query}\n```\n```\n{render(columns, rows)}\n```\n")
    finally:
        await conn.close()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1]))
