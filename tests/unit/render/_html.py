"""A small structural reader of rendered pages (stdlib html.parser): images, tables, links, text."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

__all__ = ["Page", "parse"]


@dataclass
class Table:
    id: str
    caption: str = ""
    col_headers: list[str] = field(default_factory=list)
    row_headers: list[str] = field(default_factory=list)
    unscoped_th: int = 0
    rows: list[list[str]] = field(default_factory=list)


@dataclass
class Page:
    images: dict[str, dict[str, str]] = field(default_factory=dict)  # id -> attributes
    anonymous_images: int = 0
    tables: list[Table] = field(default_factory=list)
    tags: set[str] = field(default_factory=set)
    urls: list[str] = field(default_factory=list)  # every src/href value
    text: str = ""

    def table(self, table_id: str) -> Table:
        return next(t for t in self.tables if t.id == table_id)


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self._text: list[str] = []
        self._stack: list[Table] = []
        self._cell: list[str] | None = None
        self._cell_tag = ""
        self._scope = ""
        self._in_caption = False
        self._in_head = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.page.tags.add(tag)
        for key in ("src", "href"):
            if key in a:
                self.page.urls.append(a[key])
        if tag == "img":
            if a.get("id"):
                self.page.images[a["id"]] = a
            else:
                self.page.anonymous_images += 1
        elif tag == "table":
            self._stack.append(Table(a.get("id", "")))
        elif tag == "caption":
            self._in_caption = True
        elif tag == "thead":
            self._in_head = True
        elif tag == "tr" and self._stack and not self._in_head:
            self._stack[-1].rows.append([])
        elif tag in ("th", "td"):
            self._cell, self._cell_tag, self._scope = [], tag, a.get("scope", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "caption":
            self._in_caption = False
        elif tag == "thead":
            self._in_head = False
        elif tag in ("th", "td") and self._cell is not None and self._stack:
            text = " ".join("".join(self._cell).split())
            table = self._stack[-1]
            if self._cell_tag == "th" and self._scope == "col":
                table.col_headers.append(text)
            elif self._cell_tag == "th" and self._scope == "row":
                table.row_headers.append(text)
            elif self._cell_tag == "th":
                table.unscoped_th += 1
            if not self._in_head and table.rows:
                table.rows[-1].append(text)
            self._cell = None
        elif tag == "table" and self._stack:
            self.page.tables.append(self._stack.pop())

    def handle_data(self, data: str) -> None:
        self._text.append(data)
        if self._in_caption and self._stack:
            self._stack[-1].caption += data
        if self._cell is not None:
            self._cell.append(data)

    def close(self) -> None:
        super().close()
        self.page.text = " ".join("".join(self._text).split())


def parse(html: str) -> Page:
    reader = _Reader()
    reader.feed(html)
    reader.close()
    return reader.page
