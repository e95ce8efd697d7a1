"""The CSV scanner: checks each record's quoting (RFC 4180) and notes where the wanted
columns are, in one compiled pass over the batch.

Layer: io.

Design: docs/design.md#records-and-topics.
"""

from __future__ import annotations

import numba
import numpy as np

from operators.keys import KeyBatch
from pipeline.io.extract.spans import CSV_QUOTED, RAW, Field, spec_fields
from pipeline.io.extract.specs import FieldSpec


@numba.njit(cache=True)
def scan_csv_kernel(
    data: np.ndarray, offsets: np.ndarray, valid: np.ndarray, columns: np.ndarray
) -> tuple:
    """Per row: whether its quoting is sound, and (present, start, end, mode) of each wanted
    column: present = the column exists and is not empty; mode CSV_QUOTED when the field
    holds doubled quotes to undo. A trailing line break is not part of the last field."""
    n = offsets.shape[0] - 1
    n_columns = columns.shape[0]
    last = 0
    for c in range(n_columns):
        last = max(last, columns[c])
    ok = np.zeros(n, dtype=np.bool_)
    present = np.zeros((n, n_columns), dtype=np.bool_)
    starts = np.zeros((n, n_columns), dtype=np.int64)
    ends = np.zeros((n, n_columns), dtype=np.int64)
    modes = np.zeros((n, n_columns), dtype=np.int8)
    for i in range(n):
        if not valid[i]:
            continue
        s = offsets[i]
        e = offsets[i + 1]
        while e > s and (data[e - 1] == 10 or data[e - 1] == 13):
            e -= 1
        p = s
        column = 0
        sound = True
        while True:
            doubled = False
            if p < e and data[p] == 34:
                q = p + 1
                while True:
                    if q >= e:
                        sound = False
                        break
                    if data[q] == 34:
                        if q + 1 < e and data[q + 1] == 34:
                            doubled = True
                            q += 2
                            continue
                        break
                    q += 1
                if not sound:
                    break
                field_start = p + 1
                field_end = q
                p = q + 1
                if p < e and data[p] != 44:
                    sound = False
                    break
            else:
                q = p
                while q < e and data[q] != 44:
                    q += 1
                field_start = p
                field_end = q
                p = q
            if column <= last:
                for c in range(n_columns):
                    if columns[c] == column and field_end > field_start:
                        present[i, c] = True
                        starts[i, c] = field_start
                        ends[i, c] = field_end
                        modes[i, c] = CSV_QUOTED if doubled else RAW
            if p >= e:
                break
            p += 1  # the comma
            column += 1
        ok[i] = sound
        if not sound:
            present[i, :] = False
    return ok, present, starts, ends, modes


def scan(
    column: KeyBatch, valid: np.ndarray, specs: list[FieldSpec]
) -> tuple[dict[FieldSpec, Field], np.ndarray]:
    """Each spec's :class:`~pipeline.io.extract.spans.Field` in the batch ``column``
    (``valid``: its non-null rows), and the mask of the rows whose quoting is sound."""
    wanted = list(dict.fromkeys(int(s.field) for s in specs))  # type: ignore[arg-type]
    ok, present, starts, ends, modes = scan_csv_kernel(
        column.data, column.offsets, valid, np.array(wanted, dtype=np.int64)
    )
    columns = [wanted.index(int(s.field)) for s in specs]  # type: ignore[arg-type]
    return spec_fields(specs, columns, present, starts, ends, modes), ok
