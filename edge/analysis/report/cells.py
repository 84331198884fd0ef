"""Markdown cells and tables shared by the result-table renderers (edge.analysis.report.tables, .bench): a row, a
table, percentages, MB and MiB."""


def row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def table(head, rows) -> str:
    return "\n".join([row(head), row(["---"] * len(head))] + [row(r) for r in rows])


def pct(x, digits: int = 1) -> str:
    return "" if x is None else f"{100 * x:.{digits}f}%"


def mb(b) -> str:
    return f"{b / 1e6:.1f}"


def mib(b) -> str:
    return f"{b / 2 ** 20:,.1f} MiB"
