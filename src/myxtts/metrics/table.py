"""The evaluation table: per language, the model's row beside the ground truth's.

``table`` lays out summaries (``scorer.summarize``) as ``{block: {row: summary}}``: a block
per language (and one over all when there are several), a row per kind of audio. Values
that were not computed print as ``-``.
"""

from __future__ import annotations

import math

# (summary key, header, format) in column order
COLUMNS = [("cer", "CER", "{:.3f}"), ("wer", "WER", "{:.3f}"), ("similarity", "SIM", "{:.3f}"),
           ("sig", "SIG", "{:.2f}"), ("bak", "BAK", "{:.2f}"), ("ovrl", "OVRL", "{:.2f}"),
           ("mcd_db", "MCD dB", "{:.2f}"), ("f0_rmse_cents", "F0 cents", "{:.0f}"),
           ("voicing_error", "V/UV", "{:.3f}"), ("duration_ratio", "dur", "{:.2f}"),
           ("rtf", "RTF", "{:.2f}")]
LABEL = 18  # the narrowest first column (rows are indented by 2 under their block)


def cell(value: float | None, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def table(blocks: dict[str, dict[str, dict[str, float | None]]],
          columns: list[tuple[str, str, str]] = COLUMNS) -> str:
    """Rows of ``blocks`` under one header; each block headed by its name and utterances."""
    widths = [max(len(h), 6) for _, h, _ in columns]
    label = max([LABEL] + [len(row) + 4 for rows in blocks.values() for row in rows])
    lines = [" " * label + "  ".join(h.rjust(w) for (_, h, _), w in zip(columns, widths))]
    for name, rows in blocks.items():
        n = next(iter(rows.values()), {}).get("utterances") or 0
        lines.append(f"{name} ({int(n)} utterance{'s' if n != 1 else ''})")
        for row, summary in rows.items():
            values = [cell(summary.get(key), fmt).rjust(w)
                      for (key, _, fmt), w in zip(columns, widths)]
            lines.append(f"  {row:<{label - 2}}" + "  ".join(values))
    return "\n".join(lines)
