"""The protocol's stager (ledger/two_phase.py `Stager`): the Spark stage job (jobs/stage.py)
run for one batch, in the process's one Spark session.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from jobs.stage import QUARANTINE, TABLE, attempt_folder, stage
from ledger.batch import Batch
from ledger.two_phase import StageOutput
from resources import storage
from resources.config import PipelineConfig, load_transform
from resources.spark import build_session

if TYPE_CHECKING:
    from resources.s3 import S3Access


class SharedSpark:
    """One Spark session per process, created only when a batch needs staging."""

    def __init__(
        self, master: str, conf: Mapping[str, str], object_store: S3Access | None = None
    ) -> None:
        self.master = master
        self.conf = dict(conf)
        self.object_store = object_store
        self._session: Any = None

    @classmethod
    def for_config(cls, config: PipelineConfig) -> SharedSpark:
        """The session a pipeline stages with: with s3a pointed at the object store when
        either table is on `s3://`: the process's access, the very one boto3, pyarrow and
        delta-rs use."""
        uris = (config.delta.table_uri, config.delta.quarantine_uri)
        object_store = None
        if any(uri.startswith("s3://") for uri in uris):
            object_store = storage.s3_access()
        return cls(config.spark.master, config.spark.resolved_conf(), object_store)

    def __call__(self) -> Any:
        if self._session is None:
            self._session = build_session(self.master, self.conf, object_store=self.object_store)
        return self._session


class SparkStager:
    """Runs the stage job for a batch, in a Spark session created on first use.

    The pipeline's transform is loaded when the stager is built, so a config naming a
    transform that does not import fails before any batch is planned.
    """

    def __init__(self, config: PipelineConfig, spark_factory: Callable[[], Any]) -> None:
        self.config = config
        self.spark_factory = spark_factory
        self.transform = config.load_transform()

    def stage(self, batch: Batch) -> StageOutput:
        return stage(self.spark_factory(), **self.job_arguments(batch))

    def job_arguments(self, batch: Batch) -> dict[str, Any]:
        """The stage job's inputs for `batch`: its ranges, the folders unique to its attempt,
        the tables' roots and the transform."""
        roots = {TABLE: self.config.delta.table_uri, QUARANTINE: self.config.delta.quarantine_uri}
        return {
            "bootstrap_servers": self.config.kafka.bootstrap_servers,
            "kafka_options": self.config.kafka.resolved_spark_options(),
            "ranges": batch.ranges,
            "batch_id": batch.batch_id,
            "attempt_dirs": {
                t: attempt_folder(root, batch.app_id, batch.batch_id, batch.attempt, batch.token)
                for t, root in roots.items()
            },
            "table_roots": roots,
            **self._transform_for(batch),
        }

    def _transform_for(self, batch: Batch) -> dict[str, Any]:
        """The transform the batch was planned with: a backfill records its own in its
        params. A batch staged again (invariant 11) must write what its first attempt
        wrote, whichever coordinator finishes it."""
        name = batch.params.get("transform") or self.config.transform
        transform = self.transform if name == self.config.transform else load_transform(name)
        return {"transform": transform, "transform_name": name}
