"""Why a record becomes a dead letter, and the dead letter's value in topic ``dead-letters``.

Layer: io.

One list of reasons for the grouping stage's checks of skewer's records and for the extractors
of a user's records (:mod:`pipeline.io.extractors`): a batch's ``reasons`` array holds, per
record, -1 or an index into :data:`REASONS`. The names are what a dead letter's ``reason``
field, the Redis hash ``stats:dead_letters`` and the ``reason`` label of the metrics say.
Design: docs/design.md#records-and-topics.

Example:
    >>> [REASONS[r] for r in (NO_KEY, WRONG_KIND, BAD_TIME)]
    ['no-key', 'wrong-kind', 'bad-time']
"""

from __future__ import annotations

import base64
import json

from pipeline.io import records
from pipeline.io.records import MAX_KEY_BYTES

#: Why a record cannot be used, in index order. The last two only happen on a user's topic.
REASONS = ("no-key", "key-too-large", "undecodable-value", "wrong-kind", "bad-time", "bad-amount")
NO_KEY, KEY_TOO_LARGE, UNDECODABLE, WRONG_KIND, BAD_TIME, BAD_AMOUNT = range(len(REASONS))


def dead_letter_value(
    reason: int,
    key_length: int,
    value: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    detail: str | None = None,
) -> bytes:
    """The JSON value of a dead letter (its Kafka key is the original key); ``detail`` says
    what was wrong when the reason alone does not (a user topic's extractor)."""
    details = {
        NO_KEY: "a DATA record needs a key",
        KEY_TOO_LARGE: f"key of {key_length} bytes exceeds {MAX_KEY_BYTES}",
        UNDECODABLE: (
            f"value of {len(value)} bytes is not a {records.INPUT_DTYPE.itemsize}-byte "
            f"skewer v{records.VERSION} record"
            if value is not None
            else "no value"
        ),
        WRONG_KIND: "kind is not DATA or WATERMARK",
    }
    return json.dumps(
        {
            "reason": REASONS[reason],
            "detail": detail if detail is not None else details[reason],
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "key_bytes": max(key_length, 0),
            "value_b64": base64.b64encode(value).decode("ascii") if value is not None else None,
        }
    ).encode()
