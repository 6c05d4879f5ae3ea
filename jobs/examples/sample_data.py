"""Sample page-view events for the demo, the tests and the benchmark.

Deterministic for a given seed, so a test can recompute exactly what it produced.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

APPS = ("web", "ios", "android", "tv")
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def pageview(i: int, rng: random.Random, pad_to: int = 0) -> bytes:
    """One JSON page view; `pad_to` pads the url so the record is about that many bytes."""
    event = {
        "event_id": f"ev-{i:09d}",
        "app": rng.choice(APPS),
        "user": f"user-{rng.randrange(10_000):05d}",
        "url": f"/articles/{rng.randrange(100_000)}",
        "ts": (_EPOCH + timedelta(seconds=i)).isoformat().replace("+00:00", "Z"),
    }
    raw = json.dumps(event, separators=(",", ":"))
    if pad_to > len(raw):
        event["url"] += "?" + "x" * (pad_to - len(raw) - 1)
        raw = json.dumps(event, separators=(",", ":"))
    return raw.encode()


MALFORMED = (b"not json at all", b'{"event_id": "x", "user": "no app field"}', b"{broken")


def pageviews(
    count: int, *, seed: int = 7, malformed_every: int = 0, pad_to: int = 0, start: int = 0
) -> Iterator[bytes]:
    """`count` events; every `malformed_every`-th one (if > 0) is a record that cannot parse."""
    rng = random.Random(seed + start)
    for i in range(start, start + count):
        if malformed_every and i % malformed_every == malformed_every - 1:
            yield MALFORMED[i % len(MALFORMED)]
        else:
            yield pageview(i, rng, pad_to)
