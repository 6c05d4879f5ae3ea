"""How one_topic_ledger_804554c.sql (beside this file) was written: with the code of commit
804554c (one topic per pipeline, before `kafka.topics`), from a checkout of it:

    PYTHONPATH=<checkout> python one_topic_ledger_804554c.py /tmp/one_topic.db
    sqlite3 /tmp/one_topic.db .dump > one_topic_ledger_804554c.sql

Three ACKED batches on topic `pageviews` (id topic-id-1) and one ABORTED after them, as
that code records them; tests/test_store_topics.py reads them with today's code.
"""

import sys

from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.protocol import Available
from ledger.store.ledger_store import LedgerStore
from tests.fixtures.fakes import FakeSource, wired

store = LedgerStore(f"sqlite:///{sys.argv[1]}")
source = FakeSource({0: Available(0, 10), 1: Available(0, 4)})
stager, publisher = wired()
tpc = TwoPhaseCommit(
    store,
    pipeline="pageviews",
    app_id="pageviews",
    source=source,
    stager=stager,
    publisher=publisher,
    max_records_per_partition=5,
)
tpc.run_batch()
tpc.run_batch()
source.offsets[1] = Available(0, 7)
tpc.run_batch()
source.offsets[0] = Available(0, 12)
planned = tpc.begin()
assert planned is not None
tpc.abort(planned, "test: abandoned before the vote")
store.dispose()
