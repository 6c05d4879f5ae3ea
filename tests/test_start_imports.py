"""What an `exactly` process imports before it does any work.

Every `exactly run`, every Dagster run worker and every re-drive is a new Python process, and
its imports were most of a short one's CPU (profiled under the crash tests: four fifths of a
crashed child's samples were imports, a tenth of them Alembic, a twelfth psycopg). A process
that opens a ledger already at the newest schema needs neither: Alembic only to create or
migrate a ledger, psycopg only for a PostgreSQL ledger or output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ledger.store.ledger_store import LedgerStore
from ledger.store.schema import HEAD_REVISION, _migrations

#: A process as `exactly run` starts one: the command line, the pipeline's wiring and its
#: publishers (a PostgreSQL output's among them), then the ledger opened.
START = """
import json, sys
import exactly_cli
exactly_cli.build_parser()
import jobs.wiring.pipeline, jobs.publish.postgres_outputs
from ledger.store.ledger_store import LedgerStore
LedgerStore(sys.argv[1])
print(json.dumps(sorted(m for m in ("alembic", "psycopg") if m in sys.modules)))
"""


def started_with(url: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", START, url], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_ledger_at_the_newest_schema_opens_without_alembic_or_psycopg(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    LedgerStore(url)  # created (and migrated) here, by Alembic
    assert started_with(url) == []


def test_a_new_ledger_is_still_built_by_alembic(tmp_path: Path) -> None:
    assert started_with(f"sqlite:///{tmp_path / 'ledger.db'}") == ["alembic"]


def test_the_head_revision_is_the_newest_migration() -> None:
    """The fast path compares with HEAD_REVISION: a new revision without a SCHEMA_VERSION
    bump would let a ledger stay behind unnoticed."""
    assert _migrations().get_current_head() == HEAD_REVISION
