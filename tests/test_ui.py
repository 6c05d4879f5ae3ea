"""The Dagster UI in a real browser: `dagster dev` on a free loopback port serving a pipeline on
the test broker, opened in headless Chromium (Debian's, driven by playwright). The test finds
the pipeline's job, schedule and sensors, launches a micro-batch run from the Launchpad, sees
it succeed, and checks the Delta table holds every produced record exactly once.

Screenshots (and the `dagster dev` log) are saved under test-artifacts/ui/.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from jobs.examples.sample_data import pageviews
from orchestration.tags import BATCH_TAG
from resources.config import load_config
from resources.kafka import KafkaClient
from tests.fixtures.dagster_ui import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    DagsterDev,
    chromium_executable,
)
from tests.fixtures.pipeline import assert_exactly_once

pytestmark = pytest.mark.integration

PIPELINE = "uitest"
JOB = f"{PIPELINE}_micro_batch"
PARTITIONS = f"{PIPELINE}_batches"
SCHEDULE = f"{PIPELINE}_schedule"
SENSORS = [
    f"{PIPELINE}_redrive_sensor",
    f"{PIPELINE}_stuck_prepared_sensor",
    f"{PIPELINE}_run_failure_sensor",
]
RECORDS = 300
EXPECT_DEFAULT_MS = 5_000  # playwright's own default for expect()
UI_TIMEOUT_MS = 60_000  # page loads and GraphQL answers on 2 busy cores
RUN_TIMEOUT_MS = 300_000  # queue -> run worker -> Spark session -> stage -> commit
RUN_URL = re.compile(r"/runs/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")


@pytest.fixture
def artifacts() -> Path:
    """test-artifacts/ui/, emptied of the previous run's files."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.iterdir():
        if old.is_file():
            old.unlink()
    return ARTIFACTS


@pytest.fixture
def pipeline_file(tmp_path: Path, kafka_broker: str, topic_factory: Callable[[int], str]) -> Path:
    """The pipeline's config file, alone in its folder, for a fresh 2-partition topic."""
    folder = tmp_path / "pipelines"
    folder.mkdir()
    doc = {
        "pipeline": PIPELINE,
        "kafka": {"bootstrap_servers": kafka_broker, "topic": topic_factory(2)},
        "delta": {
            "table_uri": str(tmp_path / "table"),
            "quarantine_uri": str(tmp_path / "quarantine"),
        },
        "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"},
        "spark": {"master": "local[2]"},
        "batch": {"max_records_per_partition": 100_000},
        "transform": "jobs.examples.pageviews:transform",
    }
    path = folder / f"{PIPELINE}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def dagster_dev(tmp_path: Path, pipeline_file: Path, artifacts: Path) -> Iterator[DagsterDev]:
    """`dagster dev` serving only the test pipeline; its whole process group is gone after."""
    log = tmp_path / "dagster-dev.log"
    dev = DagsterDev(
        tmp_path / "dagster_home", {"EXACTLY_PIPELINES_DIR": str(pipeline_file.parent)}, log
    )
    try:
        dev.start()
        yield dev
    finally:
        try:
            dev.close()
        finally:
            if log.exists():
                shutil.copy(log, artifacts / "dagster-dev.log")


@pytest.fixture
def chromium() -> str:
    """Debian's Chromium, checked before anything slow starts."""
    return chromium_executable()


@pytest.fixture
def page(request: pytest.FixtureRequest, chromium: str, artifacts: Path) -> Iterator[Page]:
    """A headless Chromium page; a screenshot of it is saved if the test fails."""
    failed_before = request.session.testsfailed
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, headless=True, args=CHROMIUM_ARGS
        )
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 900})
            tab = context.new_page()
            tab.set_default_timeout(UI_TIMEOUT_MS)
            expect.set_options(timeout=UI_TIMEOUT_MS)  # global to playwright: reset below
            # A fresh DAGSTER_HOME greets its first visitor with a newsletter dialog, which
            # may open over any page; dismiss it whenever it gets in the way.
            tab.add_locator_handler(
                tab.get_by_role("dialog").filter(has_text="Join the Dagster community"),
                lambda: tab.get_by_role("button", name="Skip").click(),
            )
            yield tab
            if request.session.testsfailed > failed_before:
                for i, open_tab in enumerate(context.pages):
                    with contextlib.suppress(PlaywrightError):  # keep the test's own failure
                        open_tab.screenshot(path=artifacts / f"failure-{i}.png", full_page=True)
        finally:
            expect.set_options(timeout=EXPECT_DEFAULT_MS)
            browser.close()


def run_report(dev: DagsterDev, run_id: str, what: str) -> str:
    """Why a run is not a success: its status, its error events, the dagster dev log."""
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
    path = ARTIFACTS / f"{name}.png"
    page.mouse.move(0, 0)  # no hover tooltips in the picture
    page.screenshot(path=path, full_page=True)
    return path


def test_launch_a_micro_batch_from_the_dagster_ui(
    chromium: str,
    dagster_dev: DagsterDev,
    page: Page,
    pipeline_file: Path,
    kafka_client: KafkaClient,
) -> None:
    config = load_config(pipeline_file)
    assert kafka_client.produce(config.kafka.topic, pageviews(RECORDS)) == RECORDS
    # The job is partitioned by batch id (a dynamic partition per batch); the schedule names
    # the next batch before it launches a run, and so do we before launching from the UI.
    with dg.DagsterInstance.from_config(str(dagster_dev.dagster_home)) as instance:
        instance.add_dynamic_partitions(PARTITIONS, ["1"])

    # The schedule and the three sensors are listed (stopped, as they ship).
    page.goto(f"{dagster_dev.url}/automation")
    for kind, name in [("schedules", SCHEDULE), *(("sensors", s) for s in SENSORS)]:
        link = page.get_by_role("link", name=re.compile(rf"\b{name}\b"))
        expect(link).to_be_visible()
        expect(link).to_have_attribute("href", re.compile(rf"/{kind}/{name}$"))
    shot(page, "01-automation")

    # The job, from the job list.
    page.goto(f"{dagster_dev.url}/jobs")
    page.get_by_role("link", name=re.compile(rf"\b{JOB}\b")).click()
    expect(page).to_have_url(re.compile(rf"/locations/[^/]+/jobs/{JOB}$"))
    expect(
        page.get_by_text(f"One exactly-once micro-batch of pipeline '{PIPELINE}'")
    ).to_be_visible()
    for op in ("plan", "stage", "prepare", "commit"):
        expect(page.get_by_text(f"{PIPELINE}_{op}", exact=True).first).to_be_visible()
    shot(page, "02-job")

    # Its Launchpad: pick partition 1, launch.
    page.get_by_role("tab", name="Launchpad").click()
    expect(page).to_have_url(re.compile(rf"/jobs/{JOB}/playground"))
    # Under load the partition list can arrive after the menu opened empty: reopen it (and
    # reload the Launchpad) until partition 1 is offered.
    for tries in range(4):
        page.get_by_placeholder("Partition").click()
        item = page.get_by_role("menuitem", name="1", exact=True)
        try:
            item.click(timeout=20_000)
            break
        except PlaywrightTimeoutError:
            if tries == 3:
                raise
            page.keyboard.press("Escape")
            page.reload()
    expect(page.get_by_placeholder("Partition")).to_have_value("1")
    launch = page.get_by_role("button", name="Launch Run")
    expect(launch).to_be_enabled()  # once the partition's run config and tags are loaded
    shot(page, "03-launchpad")
    launch.click()

    # Followed to the run's page, which shows the run succeed.
    expect(page).to_have_url(RUN_URL)
    match = RUN_URL.search(page.url)
    assert match is not None
    run_id = match.group(1)
    # The run's event log scrolls along while the run goes; its last event names the outcome.
    finished = page.get_by_text(re.compile(r"^RUN_(SUCCESS|FAILURE|CANCELED)$")).first
    try:
        expect(finished).to_be_visible(timeout=RUN_TIMEOUT_MS)
    except AssertionError as exc:
        raise AssertionError(run_report(dagster_dev, run_id, "did not finish")) from exc
    shot(page, "04-run")
    assert finished.inner_text() == "RUN_SUCCESS", run_report(dagster_dev, run_id, "failed")
    expect(page.get_by_text("Success", exact=True).first).to_be_visible()  # the status tag

    with dg.DagsterInstance.from_config(str(dagster_dev.dagster_home)) as instance:
        run = instance.get_run_by_id(run_id)
    assert run is not None and run.job_name == JOB
    assert run.status is dg.DagsterRunStatus.SUCCESS
    assert run.tags["dagster/partition"] == "1" and run.tags[BATCH_TAG] == "1"

    assert assert_exactly_once(config, kafka_client) == (RECORDS, 0)
