"""A Markdown table of every registered method: capabilities, parameters and defaults.

``xaudit methods`` prints it and docs/methods.md is this output (a test keeps them equal). The table
lives torch-free in :mod:`workers.method_table`; :func:`table_matches_registry` says whether it still
mirrors the registry (a test fails when it does not: `python -m workers.methods.catalogue` prints fresh rows).
"""

from __future__ import annotations

from workers.method_table import METHOD_TABLE, MethodRow, methods_markdown
from workers.methods import ALL_METHODS, get_method

__all__ = ["methods_markdown", "registry_rows", "table_matches_registry", "table_rows_source"]


def registry_rows() -> tuple[MethodRow, ...]:
    rows = []
    for name in ALL_METHODS:
        method = get_method(name)
        caps = method.capabilities
        rows.append(
            MethodRow(
                name,
                caps.gradients,
                caps.hooks,
                caps.baseline,
                caps.stochastic,
                dict(method.defaults),
                method.resolution,
                method.paper_context,
            )
        )
    return tuple(rows)


def table_matches_registry() -> bool:
    return registry_rows() == METHOD_TABLE


def table_rows_source() -> str:
    """The ``METHOD_TABLE`` rows as Python, to paste into workers/method_table.py when a method
    changes (``python -m workers.methods.catalogue``)."""
    return "".join(f"    {row!r},\n" for row in registry_rows())


if __name__ == "__main__":
    print(table_rows_source(), end="")
