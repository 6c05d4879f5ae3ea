"""The Dagster UI in a real browser, as an operator sees it: `dagster dev` on a free loopback
port serving one pipeline on the test broker, opened in headless Chromium (Debian's, driven by
playwright). One `dagster dev` serves the whole module, whose tests walk one history in order:

1. the next batch, launched from the Launchpad without typing an id, succeeds and its
   partition shows as materialized on the table asset (and the table holds every record once);
2. a batch committed by the CLI, outside Dagster, appears in the asset's Partitions view once
   the history sensor (running by default under the daemon) has ticked;
   The code location's metrics endpoint (EXACTLY_METRICS) then says what the ledger says;
3. a fill backfill over those committed offsets, launched from the backfill job's Launchpad,
   fails with its one-sentence refusal as the error on the run page;
4. the lineage graph shows the Kafka topic upstream of the table and of the quarantine;
5. a batch left PREPARED by a crashed `exactly run` turns the table's stuck-batch check red
   once the operator has turned the checks sensor on, and green again once the operator has
   released it from the abandon job's Launchpad (it voted: taken over and committed);
6. the decide job's Launchpad refuses a wrong topic id in one sentence, as rejected input;
7. a batch whose `exactly run` died before its vote says its fate on its partition's events:
   abandoned, why, and which batch read its offsets again.

A screenshot per step (and the `dagster dev` log) is saved under test-artifacts/ui/; the
README's pictures of the UI (docs/ui/) are copies of some of them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from playwright.sync_api import Browser, Page, Response, expect, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from jobs.examples.sample_data import pageviews
from jobs.wiring.pipeline import build
from ledger.coordinator.crash import CRASH_EXIT_CODE
from ledger.core.protocol import PUBLISHED, BatchState
from ledger.store.ledger_store import LedgerStore
from orchestration.metrics_endpoint import METRICS_ENV
from orchestration.tags import BATCH_TAG, REJECTED_TAG
from resources.config.loading import load_config
from resources.config.pipeline_config import PipelineConfig
from resources.jvm.process import free_port
from resources.kafka.client import KafkaClient
from tests.fixtures.dagster_ui import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    DagsterDev,
    chromium_executable,
)
from tests.fixtures.pipeline import assert_exactly_once
from tests.fixtures.spark_conf import suite_spark
from tests.test_metrics import assert_figures_match_the_ledger, scrape, value

pytestmark = pytest.mark.integration

PIPELINE = "uitest"
TABLE = f"{PIPELINE}_table"
NEXT_BATCH = f"{PIPELINE}_next_batch"
BACKFILL = f"{PIPELINE}_backfill"
ABANDON = f"{PIPELINE}_abandon"
DECIDE = f"{PIPELINE}_decide"
SCHEDULE = f"{PIPELINE}_schedule"
SENSORS = [
    f"{PIPELINE}_redrive_sensor",
    f"{PIPELINE}_stuck_prepared_sensor",
    f"{PIPELINE}_run_failure_sensor",
    f"{PIPELINE}_history_sensor",
    f"{PIPELINE}_checks_sensor",
]
TOPIC_ASSET = f"{PIPELINE}_topic"
QUARANTINE = f"{PIPELINE}_quarantine"
CHECKS_SENSOR = f"{PIPELINE}_checks_sensor"
NO_STUCK_BATCH = "no_stuck_batch"
#: where the code location serves its metrics (EXACTLY_METRICS)
METRICS_ADDRESS = f"127.0.0.1:{free_port()}"
RECORDS = 300
STUCK_AFTER_S = 5
CLI_RECORDS = 120
VIEWPORT = {"width": 1280, "height": 800}  # the README's pictures are screenshots at this size
EXPECT_DEFAULT_MS = 5_000  # playwright's own default for expect()
UI_TIMEOUT_MS = 60_000  # page loads and GraphQL answers on 2 busy cores
RUN_TIMEOUT_MS = 300_000  # queue -> run worker -> Spark session -> stage -> commit
SENSOR_INTERVAL_S = 10
SENSOR_WAIT_S = 180.0  # a few sensor intervals, plus the daemon's loop on 2 cores
RUN_URL = re.compile(r"/runs/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")
RUN_END = re.compile(r"^RUN_(SUCCESS|FAILURE|CANCELED)$")


@pytest.fixture(scope="module")
def artifacts() -> Path:
    """test-artifacts/ui/, emptied of the previous run's files."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.iterdir():
        if old.is_file():
            old.unlink()
    return ARTIFACTS


@pytest.fixture(scope="module")
def pipeline_file(
    tmp_path_factory: pytest.TempPathFactory, kafka_broker: str, kafka_client: KafkaClient
) -> Path:
    """The pipeline's config file, alone in its folder, for a fresh 2-partition topic.

    Its transform is where a user keeps one (issue 28): a module in a `code/` folder beside
    the config, named by `python_path`, beside a `gql.py` that fails when imported (such a
    file on PYTHONPATH once took the webserver down). Every test here then runs the real
    webserver, daemon and run workers on that code location."""
    root = tmp_path_factory.mktemp("ui")
    folder = root / "pipelines"
    folder.mkdir()
    code = folder / "code"
    code.mkdir()
    (code / "gql.py").write_text("raise RuntimeError('the user folder gql.py was imported')\n")
    (code / "ui_views.py").write_text(
        "from jobs.examples.pageviews import transform as pageviews\n\n\n"
        "def transform(records):\n    return pageviews(records)\n"
    )
    topic = f"test_ui-{uuid.uuid4().hex[:8]}"
    kafka_client.create_topic(topic, 2)
    doc = {
        "pipeline": PIPELINE,
        "kafka": {"bootstrap_servers": kafka_broker, "topic": topic},
        "delta": {
            "table_uri": str(root / "table"),
            "quarantine_uri": str(root / "quarantine"),
        },
        "ledger": {"url": f"sqlite:///{root / 'ledger.db'}"},
        "spark": suite_spark(),
        "batch": {"max_records_per_partition": 100_000},
        "transform": "ui_views:transform",
        "python_path": ["code"],
        # short, so that a batch left PREPARED turns its check red within the test
        "alerts": {"stuck_after_seconds": STUCK_AFTER_S},
        # the sensors tick every 10 s instead of 30-60 s: the test waits for their ticks
        "schedule": {"sensor_interval_seconds": SENSOR_INTERVAL_S},
    }
    path = folder / f"{PIPELINE}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def config(pipeline_file: Path) -> PipelineConfig:
    return load_config(pipeline_file)


@pytest.fixture(scope="module")
def dagster_dev(
    tmp_path_factory: pytest.TempPathFactory, pipeline_file: Path, artifacts: Path
) -> Iterator[DagsterDev]:
    """`dagster dev` serving only the test pipeline, shared by the module's tests; its whole
    process group is gone after."""
    root = tmp_path_factory.mktemp("dagster")
    log = root / "dagster-dev.log"
    env = {"EXACTLY_PIPELINES_DIR": str(pipeline_file.parent), METRICS_ENV: METRICS_ADDRESS}
    dev = DagsterDev(root / "dagster_home", env, log)
    try:
        dev.start()
        yield dev
    finally:
        try:
            dev.close()
        finally:
            if log.exists():
                shutil.copy(log, artifacts / "dagster-dev.log")


@pytest.fixture(scope="module")
def browser(dagster_dev: DagsterDev) -> Iterator[Browser]:
    """Debian's Chromium (checked before `dagster dev` is waited for), headless."""
    executable = chromium_executable()
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_ARGS
        )
        expect.set_options(timeout=UI_TIMEOUT_MS)  # global to playwright: reset below
        try:
            yield chromium
        finally:
            expect.set_options(timeout=EXPECT_DEFAULT_MS)
            chromium.close()


@pytest.fixture
def page(request: pytest.FixtureRequest, browser: Browser, artifacts: Path) -> Iterator[Page]:
    """A page of its own per test; a screenshot of it is saved if the test fails."""
    failed_before = request.session.testsfailed
    context = browser.new_context(viewport=VIEWPORT)
    try:
        tab = context.new_page()
        tab.set_default_timeout(UI_TIMEOUT_MS)
        # A fresh DAGSTER_HOME greets its first visitor with a newsletter dialog, which
        # may open over any page; dismiss it whenever it gets in the way.
        tab.add_locator_handler(
            tab.get_by_role("dialog").filter(has_text="Join the Dagster community"),
            lambda: tab.get_by_role("button", name="Skip").click(),
        )
        errors: list[str] = []
        tab.on("response", lambda answer: errors.extend(graphql_errors(answer)))
        yield tab
        # The UI shows a GraphQL error as a toast over whatever the test looks at; no page
        # of the product's may answer one.
        assert not errors, "GraphQL errors on the page:\n" + "\n".join(errors)
        if request.session.testsfailed > failed_before:
            name = request.node.name
            for i, open_tab in enumerate(context.pages):
                with contextlib.suppress(PlaywrightError):  # keep the test's own failure
                    open_tab.screenshot(path=artifacts / f"failure-{name}-{i}.png", full_page=True)
    finally:
        context.close()


def graphql_errors(answer: Response) -> list[str]:
    """The errors of a GraphQL answer (the operation's name and each message), if any."""
    url = urllib.parse.urlsplit(answer.url)
    if url.path != "/graphql":
        return []
    operation = urllib.parse.parse_qs(url.query).get("op", ["?"])[0]
    try:
        body = answer.json()
    except (PlaywrightError, ValueError):
        body = None
    found = body.get("errors") if isinstance(body, dict) else None
    if found:
        return [f"{operation}: {str(error.get('message', error))[:2000]}" for error in found]
    return [f"{operation}: HTTP {answer.status}"] if answer.status >= 300 else []


def run_report(dev: DagsterDev, run_id: str, what: str) -> str:
    """Why a run is not what was expected: its status, its error events, the dagster dev log."""
    with dg.DagsterInstance.from_config(str(dev.dagster_home)) as instance:
        run = instance.get_run_by_id(run_id)
        errors = []
        for entry in instance.all_logs(run_id):
            event = entry.dagster_event
            if entry.level >= logging.ERROR or (event is not None and event.is_failure):
                error = getattr(event.event_specific_data, "error", None) if event else None
                errors.append(f"{entry.user_message}\n{error.to_string() if error else ''}")
    status = run.status.value if run else "missing"
    return (
        f"run {run_id} {what} (status {status}):\n"
        + "\n".join(errors)[-6000:]
        + f"\n--- dagster dev log ---\n{dev.log_tail()}"
    )


def shot(page: Page, name: str) -> Path:
    """The page as the viewport shows it (1280x800), without hover tooltips."""
    path = ARTIFACTS / f"{name}.png"
    page.mouse.move(0, 0)
    page.screenshot(path=path)
    return path


def open_launchpad(page: Page, dev: DagsterDev, job: str, description: str) -> None:
    """The job from the job list, then its Launchpad tab, as a person gets there."""
    page.goto(f"{dev.url}/jobs")
    page.get_by_role("link", name=re.compile(rf"\b{job}\b")).click()
    expect(page).to_have_url(re.compile(rf"/locations/[^/]+/jobs/{job}$"))
    expect(page.get_by_text(description).first).to_be_visible()
    page.get_by_role("tab", name="Launchpad").click()
    expect(page).to_have_url(re.compile(rf"/jobs/{job}/playground"))


def launch_and_follow(page: Page, dev: DagsterDev) -> tuple[str, str]:
    """Launch the Launchpad's run and follow it to its end on the run page: (run id, outcome)."""
    launch = page.get_by_role("button", name="Launch Run")
    expect(launch).to_be_enabled()  # once the run config is validated
    launch.click()
    expect(page).to_have_url(RUN_URL)
    match = RUN_URL.search(page.url)
    assert match is not None
    run_id = match.group(1)
    # The run's event log scrolls along while the run goes; its last event names the outcome.
    finished = page.get_by_text(RUN_END).first
    try:
        expect(finished).to_be_visible(timeout=RUN_TIMEOUT_MS)
    except AssertionError as exc:
        raise AssertionError(run_report(dev, run_id, "did not finish")) from exc
    return run_id, finished.inner_text()


def open_partition(page: Page, dev: DagsterDev, key: str) -> None:
    """The table asset's Partitions view with partition `key` selected."""
    page.goto(f"{dev.url}/assets/{TABLE}?view=partitions&partition={key}")


def partition_shows_materialized(page: Page, key: str, timeout_ms: float) -> None:
    """The selected partition's panel: the green "Materialized" tag, and the materialization's
    metadata naming the batch (`<pipeline>/<id>`)."""
    expect(page.get_by_text("Materialized", exact=True).first).to_be_visible(timeout=timeout_ms)
    label = page.get_by_text(f"{PIPELINE}/{key}", exact=True).first
    expect(label).to_be_visible(timeout=timeout_ms)


def test_launch_the_next_batch_from_the_launchpad(
    dagster_dev: DagsterDev, page: Page, config: PipelineConfig, kafka_client: KafkaClient
) -> None:
    assert kafka_client.produce(config.kafka.topic, pageviews(RECORDS)) == RECORDS

    # The schedule and the four sensors are listed.
    page.goto(f"{dagster_dev.url}/automation")
    for kind, name in [("schedules", SCHEDULE), *(("sensors", s) for s in SENSORS)]:
        link = page.get_by_role("link", name=re.compile(rf"\b{name}\b"))
        expect(link).to_be_visible()
        expect(link).to_have_attribute("href", re.compile(rf"/{kind}/{name}$"))
    shot(page, "01-automation")

    # The next-batch job's Launchpad: no partition to choose, no id to type.
    open_launchpad(
        page,
        dagster_dev,
        NEXT_BATCH,
        f"Plan and run the next exactly-once micro-batch of pipeline '{PIPELINE}'",
    )
    expect(page.get_by_placeholder("Partition")).to_have_count(0)
    shot(page, "02-next-batch-launchpad")
    run_id, outcome = launch_and_follow(page, dagster_dev)
    shot(page, "03-next-batch-run")
    assert outcome == "RUN_SUCCESS", run_report(dagster_dev, run_id, "failed")
    expect(page.get_by_text("Success", exact=True).first).to_be_visible()  # the status tag

    with dg.DagsterInstance.from_config(str(dagster_dev.dagster_home)) as instance:
        run = instance.get_run_by_id(run_id)
    assert run is not None and run.job_name == NEXT_BATCH
    assert run.tags[BATCH_TAG] == "1"

    # Batch 1 is a partition of the table asset, materialized by that run.
    open_partition(page, dagster_dev, "1")
    partition_shows_materialized(page, "1", UI_TIMEOUT_MS)
    expect(page.get_by_text("Materialized (1)", exact=True)).to_be_visible()
    expect(page.get_by_text("Missing (0)", exact=True)).to_be_visible()
    shot(page, "04-asset-partition-1")

    assert assert_exactly_once(config, kafka_client) == (RECORDS, 0)


def test_a_batch_committed_by_the_cli_appears_in_the_partitions_view(
    dagster_dev: DagsterDev,
    page: Page,
    config: PipelineConfig,
    kafka_client: KafkaClient,
    spark: Any,
) -> None:
    assert kafka_client.produce(config.kafka.topic, pageviews(CLI_RECORDS)) == CLI_RECORDS
    report = build(config, spark_factory=lambda: spark).run_batch()
    assert report is not None
    key = str(report.batch.batch_id)

    # No Dagster run committed it: the history sensor records it from the ledger on a tick.
    open_partition(page, dagster_dev, key)
    deadline = time.monotonic() + SENSOR_WAIT_S
    while True:
        try:
            partition_shows_materialized(page, key, 15_000)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            open_partition(page, dagster_dev, key)
    # Both batches, each with its own materialization; none Missing.
    expect(page.get_by_text("Materialized (2)", exact=True)).to_be_visible()
    expect(page.get_by_text("Missing (0)", exact=True)).to_be_visible()
    shot(page, "05-cli-batch-in-partitions")
    with dg.DagsterInstance.from_config(str(dagster_dev.dagster_home)) as instance:
        runs = instance.get_runs(dg.RunsFilter(tags={BATCH_TAG: key}))
    assert runs == []  # the picture is the ledger's, not a run's


def test_the_code_location_serves_figures_that_match_the_ledger(
    dagster_dev: DagsterDev, config: PipelineConfig
) -> None:
    """EXACTLY_METRICS: the code server `dagster dev` started serves every pipeline's figures
    (orchestration/metrics_endpoint.py); its run workers, which load the same code location,
    do not take the port from it. Checked against the ledger after the two batches above."""
    port = int(METRICS_ADDRESS.rpartition(":")[2])
    deadline = time.monotonic() + SENSOR_WAIT_S
    while True:
        try:
            figures = scrape(port)
            break
        except OSError:  # the code server loads the location in the background
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
    assert_figures_match_the_ledger(figures, config, RECORDS + CLI_RECORDS)
    assert value(figures, "exactly_batches", pipeline=PIPELINE, state="ACKED") == 2


def test_a_refused_fill_shows_its_sentence_on_the_run_page(
    dagster_dev: DagsterDev, page: Page, config: PipelineConfig
) -> None:
    committed = LedgerStore(config.ledger.url).batches(app_id=config.app_id, limit=10)
    assert committed, "the tests above commit the batches this fill overlaps"

    open_launchpad(
        page, dagster_dev, BACKFILL, f"Fill or replace offset ranges of pipeline '{PIPELINE}'"
    )
    overlapping = (
        f"ops: {{{PIPELINE}_backfill_ranges: {{config: {{mode: fill, "
        "ranges: [{partition: 0, start: 0, end: 10}]}}}"
    )
    type_config(page, overlapping)
    shot(page, "06-backfill-launchpad")
    run_id, outcome = launch_and_follow(page, dagster_dev)
    assert outcome == "RUN_FAILURE", run_report(dagster_dev, run_id, "was not refused")

    topic = config.kafka.topic
    sentence = page.get_by_text(
        re.compile(rf"Refused: fill {re.escape(topic)}-0\[0,10\) overlaps committed data")
    ).first
    expect(sentence).to_be_visible()
    # the sentence is all the failure shows: no exception class before it, no stack under it
    shown = page.locator("body")
    expect(shown).not_to_contain_text("Stack Trace")
    expect(shown).not_to_contain_text("dagster._core.definitions.events.Failure")
    sentence.scroll_into_view_if_needed()
    shot(page, "07-refused-fill")
    with dg.DagsterInstance.from_config(str(dagster_dev.dagster_home)) as instance:
        run = instance.get_run_by_id(run_id)
    assert run is not None and run.tags[REJECTED_TAG] == "BackfillError"

    # Told apart from failures at a glance: the Runs list shows the tag on the run's row,
    # and filtering by it lists the refused runs alone.
    page.goto(f"{dagster_dev.url}/runs")
    chip = page.get_by_text(f"{REJECTED_TAG}: BackfillError", exact=True).first
    expect(chip).to_be_visible()
    shot(page, "07b-runs-list-rejected-tag")
    chip.hover()  # Dagster's own tag menu: "Add tag to filter" lists the refused runs alone
    page.get_by_text("Add tag to filter", exact=True).click()
    expect(page).to_have_url(re.compile(r"rejected"))
    expect(page.get_by_text(run_id[:8]).first).to_be_visible()
    expect(page.get_by_text("Success", exact=True)).to_have_count(0)  # batch 1's run is gone
    shot(page, "07c-runs-filtered-by-rejected")


def test_the_lineage_runs_from_the_topic_to_both_tables(
    dagster_dev: DagsterDev, page: Page
) -> None:
    page.goto(f"{dagster_dev.url}/asset-groups")  # the navigation's "Lineage"
    for asset in (TOPIC_ASSET, TABLE, QUARANTINE):
        expect(page.get_by_text(asset, exact=True).first).to_be_visible()
    shot(page, "08-lineage")
    # Each table's own Lineage tab (its neighbours only) has the topic upstream.
    for asset in (TABLE, QUARANTINE):
        page.goto(f"{dagster_dev.url}/assets/{asset}?view=lineage")
        expect(page.get_by_text(TOPIC_ASSET, exact=True).first).to_be_visible()
    # The pipeline's assets are one group, named for it.
    page.goto(f"{dagster_dev.url}/asset-groups/{PIPELINE}")
    for asset in (TOPIC_ASSET, TABLE, QUARANTINE):
        expect(page.get_by_text(asset, exact=True).first).to_be_visible()
    # The sensors that keep the table (history, stuck alerts, checks) are its automation.
    page.goto(f"{dagster_dev.url}/assets/{TABLE}")
    page.get_by_text("3 sensors", exact=True).click()
    for sensor in (
        f"{PIPELINE}_history_sensor",
        f"{PIPELINE}_stuck_prepared_sensor",
        CHECKS_SENSOR,
    ):
        expect(page.get_by_text(sensor, exact=True).first).to_be_visible()
    page.wait_for_timeout(500)  # the dialog's fade-in, for the picture
    shot(page, "08a-table-automation")
    # The lag over time: each commit's check evaluation observes the topic asset.
    page.goto(f"{dagster_dev.url}/assets/{TOPIC_ASSET}?view=events")
    expect(page.get_by_text("total_lag").first).to_be_visible(timeout=UI_TIMEOUT_MS)
    shot(page, "08b-topic-lag-observations")


def crash_at(pipeline_file: Path, point: str) -> None:
    """`exactly run` of the pipeline, dying at crash point `point`."""
    crashed = subprocess.run(
        [sys.executable, "-m", "exactly_cli", "run", "-c", str(pipeline_file)],
        env={**os.environ, "EXACTLY_CRASH_AT": point},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stdout + crashed.stderr


def type_config(page: Page, config: str) -> None:
    """Replace the Launchpad's run config with `config`, as typed."""
    editor = page.locator(".CodeMirror").first
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(config)


def stuck_check_shows(page: Page, dev: DagsterDev, result: str, timeout_s: float) -> None:
    """Reload the table asset's Checks view, the stuck-batch check selected, until its latest
    evaluation result is `result` ("Failed" or "Passed")."""
    deadline = time.monotonic() + timeout_s
    while True:
        page.goto(f"{dev.url}/assets/{TABLE}?view=checks")
        page.get_by_text(NO_STUCK_BATCH, exact=True).first.click()
        try:
            expect(page.get_by_text(result, exact=True).first).to_be_visible(timeout=15_000)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise


def test_a_stuck_batch_turns_the_check_red_then_green(
    dagster_dev: DagsterDev,
    page: Page,
    config: PipelineConfig,
    pipeline_file: Path,
    kafka_client: KafkaClient,
    spark: Any,
) -> None:
    assert kafka_client.produce(config.kafka.topic, pageviews(CLI_RECORDS)) == CLI_RECORDS
    # `exactly run` dies right after its batch voted: the batch stays PREPARED.
    crash_at(pipeline_file, "after_prepare")

    # The operator turns the checks sensor on (it ships stopped).
    page.goto(f"{dagster_dev.url}/automation")
    page.get_by_role("link", name=re.compile(rf"\b{CHECKS_SENSOR}\b")).click()
    expect(page).to_have_url(re.compile(rf"/sensors/{CHECKS_SENSOR}$"))
    running = page.get_by_role("row").filter(has_text="Running")
    running.locator("label").first.click()  # the switch drawn over its hidden checkbox
    expect(running.get_by_role("checkbox")).to_be_checked()

    time.sleep(STUCK_AFTER_S)
    stuck_check_shows(page, dagster_dev, "Failed", SENSOR_WAIT_S)
    expect(page.get_by_text(re.compile(r"stuck past")).first).to_be_visible()  # the verdict
    # who holds it and what frees it: its owner died, and the re-drive sensor ships stopped
    freed = rf"is gone and no Dagster run holds it: {PIPELINE}_redrive_sensor is stopped: turn"
    expect(page.get_by_text(re.compile(freed)).first).to_be_visible()
    shot(page, "09-stuck-check-red")

    # The operator releases it from the abandon job's Launchpad: it voted, so it is taken
    # over and committed, never abandoned; the next tick turns the check green again.
    held = LedgerStore(config.ledger.url).batches(
        app_id=config.app_id, states={BatchState.PREPARED}
    )
    assert len(held) == 1
    batch_id = held[0].batch_id
    open_launchpad(
        page, dagster_dev, ABANDON, f"Release a batch of pipeline '{PIPELINE}' that a hung run"
    )
    type_config(
        page,
        f"ops: {{{ABANDON}_op: {{config: {{batch_id: {batch_id}, reason: the UI test hung it}}}}}}",
    )
    shot(page, "10-abandon-launchpad")
    run_id, outcome = launch_and_follow(page, dagster_dev)
    assert outcome == "RUN_SUCCESS", run_report(dagster_dev, run_id, "failed")
    told = f"batch {PIPELINE}/{batch_id} had voted, so it is never abandoned: taken over"
    expect(page.get_by_text(re.compile(re.escape(told))).first).to_be_visible()
    shot(page, "11-abandon-run")
    released = LedgerStore(config.ledger.url).get(config.app_id, batch_id)
    assert released is not None and released.state in PUBLISHED
    assert released.metrics["taken_over_by"] == f"Dagster run {run_id}: the UI test hung it"
    stuck_check_shows(page, dagster_dev, "Passed", SENSOR_WAIT_S)
    shot(page, "12-stuck-check-green")


def test_the_decide_job_refuses_a_wrong_topic_id_from_its_launchpad(
    dagster_dev: DagsterDev, page: Page, config: PipelineConfig
) -> None:
    """An operator decision from the Launchpad: the decide job's typed config, and a refusal
    in the same words the CLI uses, naming the job's own keys, as rejected input."""
    open_launchpad(page, dagster_dev, DECIDE, "Record an operator's decision for pipeline")
    type_config(
        page,
        f"ops: {{{DECIDE}_op: {{config: {{kind: new-topic, "
        "topic_id: AAAAAAAAAAAAAAAAAAAAAA, reason: the UI test}}}",
    )
    shot(page, "13-decide-launchpad")
    run_id, outcome = launch_and_follow(page, dagster_dev)
    assert outcome == "RUN_FAILURE", run_report(dagster_dev, run_id, "was not refused")
    refused = page.get_by_text(
        re.compile(rf"Refused: topic {re.escape(config.kafka.topic)} has id \S+, not AAAA")
    ).first
    expect(refused).to_be_visible()
    expect(page.locator("body")).not_to_contain_text("Stack Trace")
    refused.scroll_into_view_if_needed()
    shot(page, "14-decide-refused")
    with dg.DagsterInstance.from_config(str(dagster_dev.dagster_home)) as instance:
        run = instance.get_run_by_id(run_id)
    assert run is not None and run.tags[REJECTED_TAG] == "DecisionError"


def test_an_abandoned_batch_says_its_fate_on_its_partition(
    dagster_dev: DagsterDev,
    page: Page,
    config: PipelineConfig,
    pipeline_file: Path,
    kafka_client: KafkaClient,
    spark: Any,
) -> None:
    """A batch whose `exactly run` died before its vote is abandoned by the next start; its
    partition says so, why, and which batch read its offsets again (the history sensor)."""
    assert kafka_client.produce(config.kafka.topic, pageviews(CLI_RECORDS)) == CLI_RECORDS
    crash_at(pipeline_file, "after_plan")
    (dead,) = LedgerStore(config.ledger.url).batches(app_id=config.app_id, limit=1)
    start = build(config, spark_factory=lambda: spark)
    assert [b.state for b in start.recover_and_commit()] == [BatchState.ABORTED]
    report = start.run_batch()
    assert report is not None and report.batch.batch_id == dead.batch_id + 1
    key = str(dead.batch_id)

    fate = re.compile(
        rf"batch {PIPELINE}/{key} was abandoned \(ABORTED at .*its offsets were read again by "
        rf"batch {report.batch.batch_id}"
    )
    deadline = time.monotonic() + SENSOR_WAIT_S
    while True:
        page.goto(f"{dagster_dev.url}/assets/{TABLE}?view=events&partition={key}")
        try:
            expect(page.get_by_text(fate).first).to_be_visible(timeout=15_000)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
    shot(page, "15-aborted-partition-fate")
