"""A TableData laid out for a terminal of any width without ever cutting a number.

Rich, asked to fit a wide table into 80 columns, shrinks every column alike and ends cells
with "…" (`204…`), which turns a number into a different number. Here each column gets the
width it needs: text columns (labels, size lists) wrap at spaces, number columns keep their
full width. When even that is too wide, the columns are dealt into several tables, each
repeating the first (label) column, so every cell still shows whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table

from cgtool.reports.tables import TableData, for_people, row_style, stacked


@dataclass(frozen=True, slots=True)
class _Style:
    boxed: bool  # plan_view's framed tables; otherwise check's and capture's plain head rule
    stack_headers: bool  # "retained MiB" as two lines: narrower number columns


class FittedTable:
    """A rich renderable: `data` as one table when it fits the console, else as several."""

    def __init__(self, data: TableData, boxed: bool = False, stack_headers: bool = True) -> None:
        self.data = for_people(data)
        self.style = _Style(boxed, stack_headers)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from self.tables(console, options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(1, options.max_width)

    @property
    def row_count(self) -> int:
        return len(self.data.rows)

    def tables(self, console: Console, width: int) -> Iterator[Table]:
        """The tables to print at `width` columns: one, or several of the columns each."""
        data, count = self.data, len(self.data.columns)
        natural = [self._width(i, whole=True) for i in range(count)]
        least = [self._width(i, whole=False) for i in range(count)]
        one, two = self._overhead(console, 1), self._overhead(console, 2)
        groups = _deal(list(range(1, count)), least, width, base=2 * one - two, per=two - one)
        for n, group in enumerate(groups):
            columns = [0, *group]
            widths = _shrink([natural[i] for i in columns], [least[i] for i in columns],
                             width - self._overhead(console, len(columns)))
            title = data.title if n == 0 else f"{data.title} (continued)" if data.title else ""
            table = self._table(columns, widths, title)
            if n == len(groups) - 1:
                table.caption = data.caption or None
            yield table

    def _wraps(self, i: int) -> bool:
        # Labels and lists wrap between words; every other column is a figure, kept whole.
        return i == 0 or i in self.data.wrapping or (self.data.wrap_last and i == len(self.data.columns) - 1)

    def _header(self, i: int) -> str:
        column = self.data.columns[i]
        return stacked(column) if self.style.stack_headers else column

    def _width(self, i: int, whole: bool) -> int:
        texts = [self._header(i)] + [row[i] for row in self.data.rows if i < len(row)]
        lines = [line for text in texts for line in str(text).splitlines()]
        if whole or not self._wraps(i):
            return max((cell_len(line) for line in lines), default=1) or 1
        return max((cell_len(word) for line in lines for word in line.split()), default=1) or 1

    def _overhead(self, console: Console, columns: int = 1) -> int:
        # Borders and padding, measured on rich's own layout rather than counted by hand.
        probe = self._bare(columns * [1])
        return Measurement.get(console, console.options, probe).maximum - columns

    def _bare(self, widths: list[int]) -> Table:
        if self.style.boxed:
            table = Table(box=box.HEAVY_HEAD)
        else:
            table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
        for width in widths:
            table.add_column(width=width)
        return table

    def _table(self, columns: list[int], widths: list[int], title: str) -> Table:
        table = self._bare([])
        table.title = title or None
        for i, width in zip(columns, widths):
            wraps = self._wraps(i)
            left = wraps and (i == 0 or i in self.data.wrapping or len(columns) == 2)
            table.add_column(self._header(i), justify="left" if left else "right", width=width,
                             no_wrap=not wraps, overflow="fold")
        for r, row in enumerate(self.data.rows):
            table.add_row(*(str(row[i]) if i < len(row) else "" for i in columns),
                          style=row_style(self.data, r))
        return table


def _deal(rest: list[int], least: list[int], width: int, base: int, per: int) -> list[list[int]]:
    """Columns after the first, in order, into as few groups as fit `width` beside the first
    column at their least widths (a table of n columns spends base + per * n on borders and
    padding). A column too wide even alone still gets a group: its lines then run past the
    terminal's edge, where the terminal wraps them, rather than being cut."""
    start = base + per + least[0]
    groups: list[list[int]] = [[]]
    used = start
    for i in rest:
        need = least[i] + per
        if groups[-1] and used + need > width:
            groups.append([])
            used = start
        groups[-1].append(i)
        used += need
    return groups


def _shrink(natural: list[int], least: list[int], room: int) -> list[int]:
    """Widths within `room`: the widest wrapping column gives way first, never below its
    longest word; columns that do not wrap (least == natural) keep their width."""
    widths = list(natural)
    while sum(widths) > room:
        slack = [w - m for w, m in zip(widths, least)]
        if max(slack) <= 0:
            break
        widest = max((i for i in range(len(widths)) if slack[i] > 0), key=lambda i: widths[i])
        widths[widest] -= 1
    return widths
