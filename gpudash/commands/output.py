"""How a command's text meets the terminal: fitted to its width when it is one (tables split into groups of
whole columns, long lines wrapped under their indent), one record per line when piped into a script, a
file or grep. `status` showed the way; every command that prints tables or long lines goes through here."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import click
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

PIPED_WIDTH = 100_000  # piped output never wraps: a record stays one line, whatever its length
G = TypeVar("G")


def terminal_width(err: bool = False) -> int | None:
    """The width to fit in: COLUMNS where it is set, else the terminal's when stdout is one; None when
    piped. Stderr (`err`) is fitted only where it is a terminal: its warnings are log records when it goes
    to a file or a journal, one line each, whatever COLUMNS says."""
    stream = sys.stderr if err else sys.stdout
    if err and not stream.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if stream.isatty():
        try:
            return os.get_terminal_size(stream.fileno()).columns or shutil.get_terminal_size().columns
        except (OSError, ValueError):
            return shutil.get_terminal_size().columns
    return None


def console(err: bool = False) -> Console:
    """A Rich console as wide as the terminal, or one that never wraps when piped."""
    return Console(highlight=False, width=terminal_width(err) or PIPED_WIDTH, stderr=err, soft_wrap=False)


def least_width(console: Console, table: Table) -> int:
    """The cells `table` needs: its columns that do not wrap whole, the others at their `min_width` (at
    least their longest word), with the padding of a plain_table between columns."""
    options = console.options.update_width(PIPED_WIDTH)
    total = 0
    for column in table.columns:
        sizes = [Measurement.get(console, options, cell) for cell in (column.header, *column.cells)]
        total += (max(m.maximum for m in sizes) if column.no_wrap
                  else max(column.min_width or 0, *(m.minimum for m in sizes)))
    return total + 2 * max(0, len(table.columns) - 1)


def fitted_tables(console: Console, groups: Sequence[G], build: Callable[[Sequence[G]], Table]) -> list[Table]:
    """The fewest tables of whole, consecutive column groups that fit the console (one table with every
    group when it fits, else two, and so on to one a group); `build` makes the table of some groups."""
    for count in range(1, len(groups) + 1):
        per = -(-len(groups) // count)
        tables = [build(groups[i:i + per]) for i in range(0, len(groups), per)]
        if count == len(groups) or all(least_width(console, t) <= console.width for t in tables):
            return tables
    return []


def print_tables(console: Console, tables: Sequence[Table], err: bool = False) -> None:
    """The tables one after another, a blank line between, without the spaces Rich pads lines with."""
    with console.capture() as captured:
        for i, table in enumerate(tables):
            if i:
                console.print()
            console.print(table)
    for line in captured.get().splitlines():
        click.echo(line.rstrip(), err=err)


def plain_table(**kwargs: object) -> Table:
    """The tables commands print: no box, bold headers, titles on the left."""
    return Table(box=None, header_style="bold", pad_edge=False, title_justify="left", **kwargs)  # type: ignore[arg-type]


def wrapped(line: str, width: int | None, indent: str = "") -> list[str]:
    """`line` in rows of `width` cells, the rows after the first under `indent` (the line as it is when
    `width` is None: piped). A line that starts indented keeps that indent on every row."""
    if width is None or len(line) <= width:
        return [line]
    lead = line[:len(line) - len(line.lstrip(" "))]
    return textwrap.wrap(line, width, initial_indent="", subsequent_indent=lead + indent, break_long_words=True,
                         break_on_hyphens=False, drop_whitespace=True) or [line]


def echo_fitted(lines: Iterable[str], indent: str = "", err: bool = False) -> None:
    """Print each line wrapped to the terminal (unchanged when piped)."""
    width = terminal_width(err)
    for line in lines:
        for row in wrapped(line, width, indent):
            click.echo(row, err=err)
