"""A plain-text table in aligned columns (the bench command's tables, the
IPython extension's line after each cell)."""


def columns(header, body, text):
    """A plain-text table of ``header`` and the rows of ``body`` (strings,
    as many as the header's), a rule of dashes under the header: the
    columns whose titles are in ``text`` left-aligned, the figures
    right-aligned, two spaces between columns."""
    widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if title in text else cell.rjust(w)
                       for title, cell, w in zip(header, row, widths)).rstrip()
             for row in [header] + body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
