"""How a Delta location is opened through delta-rs, and what its failures mean: no table
(None), a store that fails (one line naming the table, resources/delta/options.py), or a
folder that is not a Delta table's (a ConfigError the operator fixes in the config).

Apart from resources/delta/table.py, which decides when a table is opened afresh and when
a kept one is vouched for; this module only opens.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from ledger.core.errors import ConfigError
from resources.delta.options import store_failure

#: What delta-rs says of a `_delta_log` it cannot read as a table's.
_NOT_A_TABLE = re.compile(
    r"Invalid Checkpoint|_last_checkpoint hint|No files in log segment|not a Delta table|"
    r"No table metadata or protocol found"
)
#: What delta-rs says of a log whose entries hold no metadata: also what a reader sees of a
#: table being created on a store that lists an object before its bytes are in (s3proxy's
#: filesystem backend), so a fresh load reads such a log again for a while first.
_NO_METADATA_YET = re.compile(r"No table metadata or protocol found")
#: How long a fresh load waits for a log entry's content (`_NO_METADATA_YET`), in tries.
_METADATA_WAITS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)


def open_table(
    uri: str, storage_options: Mapping[str, str], version: int | None = None
) -> DeltaTable | None:
    """A new table object for `uri`, at `version` or the latest; None if there is no table."""
    try:
        return _read_log(uri, storage_options, version)
    except TableNotFoundError:
        return None
    except OSError as exc:
        raise store_failure(uri, exc) from exc
    except DeltaError as exc:
        # a log delta-rs cannot read as a table's (a checkpoint hint without its
        # checkpoint, a log with no commit, entries without metadata): the config points
        # at something that is not a Delta table, an operator's to fix, said with the
        # folder it is about
        if version is not None or _NOT_A_TABLE.search(str(exc)) is None:
            raise  # a version gone from the log is no news about the folder
        raise ConfigError(
            f"`{uri}` is not a Delta table (delta-rs: {str(exc).splitlines()[0]}); "
            "point the config at a Delta table's folder, or at a new or empty one"
        ) from exc


def _read_log(uri: str, storage_options: Mapping[str, str], version: int | None) -> DeltaTable:
    """delta-rs's table at `version` or the latest; the latest read again for a while
    when its log shows entries without metadata yet (`_NO_METADATA_YET`)."""
    for wait in (*_METADATA_WAITS, None):
        try:
            return DeltaTable(uri, version=version, storage_options=dict(storage_options) or None)
        except DeltaError as exc:
            if wait is None or version is not None or not _NO_METADATA_YET.search(str(exc)):
                raise
            time.sleep(wait)
    raise AssertionError("unreachable: the last try returns or raises")
