"""Transforms where users keep them (resources/config/transforms.py): a file or a `python_path`
beside the pipeline's config, never leaking into other imports, never shadowing an installed
module, and reaching Spark's Python workers without PYTHONPATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from ledger.core.errors import ConfigError
from resources.config.loading import load_config

REPO = Path(__file__).resolve().parent.parent

_PANDAS_TRANSFORM = '''
import json

import pandas as pd

from jobs.stage.pandas_transform import pandas_transform
from {helper} import parse_app


@pandas_transform("app string")
def transform(batch: pd.DataFrame) -> pd.DataFrame:
    """Lands the app of a JSON page view; anything else is an error."""
    apps, errors = [], []
    for value in batch["value"]:
        app, error = parse_app(value)
        apps.append(app)
        errors.append(error)
    return batch.assign(app=apps, _error=errors)
'''

_HELPER = """
import json


def parse_app(value):
    try:
        return json.loads(value)["app"], None
    except Exception as exc:  # noqa: BLE001 - the reason goes to the quarantine
        return None, f"not a page view: {exc}"
"""


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def _config(tmp_path: Path, transform: str, **extra: Any) -> Path:
    doc = {
        "pipeline": "orders",
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "orders"},
        "delta": {"table_uri": "t", "quarantine_uri": "q"},
        "transform": transform,
        **extra,
    }
    path = tmp_path / "conf" / "orders.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def _in_subprocess(code: str, cwd: Path) -> dict[str, Any]:
    """Run `code` in a fresh interpreter (imports are process-wide state) from `cwd`, with
    the repository importable, and return the JSON it prints last."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_transform_file_beside_the_config_loads_with_its_sibling_modules(
    tmp_path: Path,
) -> None:
    code = tmp_path / "conf" / "code"
    _write(code, "order_helpers.py", _HELPER)
    _write(code, "orders_transform.py", _PANDAS_TRANSFORM.format(helper="order_helpers"))
    path = _config(tmp_path, "code/orders_transform.py:transform")
    result = _in_subprocess(
        f"""
        import json, sys
        from resources.config.loading import load_config
        config = load_config({str(path)!r})
        function = config.load_transform()
        print(json.dumps({{
            "transform": config.transform,
            "name": function.pandas_function.__module__,
            "last": sys.path[-1],
        }}))
        """,
        cwd=tmp_path,
    )
    assert result["transform"] == f"{code / 'orders_transform.py'}:transform"
    assert result["name"] == "orders_transform"
    # appended, never prepended: an installed module always wins over the user's folder
    assert result["last"] == str(code)


def test_python_path_beside_the_config_makes_a_module_transform_importable(
    tmp_path: Path,
) -> None:
    lib = tmp_path / "conf" / "lib"
    _write(lib / "acme", "__init__.py", "")
    _write(lib / "acme", "helpers.py", _HELPER)
    _write(lib / "acme", "orders.py", _PANDAS_TRANSFORM.format(helper="acme.helpers"))
    path = _config(tmp_path, "acme.orders:transform", python_path=["lib"])
    config = load_config(path)
    assert config.python_path == [str(lib)]
    result = _in_subprocess(
        f"""
        import json
        from resources.config.loading import load_config
        function = load_config({str(path)!r}).load_transform()
        print(json.dumps({{"module": function.pandas_function.__module__}}))
        """,
        cwd=tmp_path,
    )
    assert result == {"module": "acme.orders"}


def test_a_folder_with_a_file_named_like_an_installed_package_shadows_nothing(
    tmp_path: Path,
) -> None:
    """The issue's webserver outage: `gql.py` in the transforms' folder, once that folder was
    on PYTHONPATH, replaced the `gql` package the Dagster webserver imports."""
    lib = tmp_path / "conf" / "lib"
    _write(lib, "gql.py", "raise RuntimeError('the user gql.py was imported')\n")
    _write(lib, "order_helpers.py", _HELPER)
    _write(lib, "orders_transform.py", _PANDAS_TRANSFORM.format(helper="order_helpers"))
    path = _config(tmp_path, "orders_transform:transform", python_path=["lib"])
    result = _in_subprocess(
        f"""
        import json, os
        from resources.config.loading import load_config
        load_config({str(path)!r}).load_transform()
        import gql
        print(json.dumps({{"gql": gql.__file__, "env": os.environ.get("PYTHONPATH")}}))
        """,
        cwd=tmp_path,
    )
    assert "site-packages" in result["gql"]
    assert result["env"] == str(REPO)  # nothing added for child processes either


@pytest.mark.parametrize(
    ("files", "transform", "python_path", "message"),
    [
        (
            {"gql.py": "def transform(df):\n    return df\n"},
            "gql:transform",
            ["lib"],
            r"^transform: module 'gql' in .*/lib has the name of an installed module \(.*gql"
            r".*\); rename it",
        ),
        (
            {"json.py": "def transform(df):\n    return df\n"},
            "lib/json.py:transform",
            [],
            r"^transform: module 'json' in .*/lib has the name of an installed module "
            r"\(Python's standard library\); rename it",
        ),
        ({}, "lib/missing.py:transform", [], r"^transform: no file .*/conf/lib/missing\.py$"),
        (
            {"orders.py": "x = 1\n"},
            "lib/orders.py:transform",
            [],
            r"^transform: .*/lib/orders\.py has no function 'transform'$",
        ),
        (
            {"my-orders.py": "def transform(df):\n    return df\n"},
            "lib/my-orders.py:transform",
            [],
            r"^transform: 'my-orders' is not a Python module name",
        ),
    ],
)
def test_a_transform_that_cannot_be_loaded_safely_is_refused_in_one_line(
    tmp_path: Path,
    files: dict[str, str],
    transform: str,
    python_path: list[str],
    message: str,
) -> None:
    for name, text in files.items():
        _write(tmp_path / "conf" / "lib", name, text)
    config = load_config(_config(tmp_path, transform, python_path=python_path))
    with pytest.raises(ConfigError, match=message) as caught:
        config.load_transform()
    assert "\n" not in str(caught.value)


def test_a_python_path_that_is_not_a_folder_is_a_config_error_naming_the_key(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match=r"python_path: .*/conf/nowhere is not a folder"):
        load_config(_config(tmp_path, "x:transform", python_path=["nowhere"]))


def test_two_pipelines_whose_transform_modules_share_a_name_are_refused(tmp_path: Path) -> None:
    """One Dagster code location loads every pipeline in one process: the second
    `orders_transform` would silently be the first pipeline's module."""
    first = _write(tmp_path / "conf" / "a", "orders_transform.py", "def transform(df):\n  1\n")
    _write(tmp_path / "conf" / "b", "orders_transform.py", "def transform(df):\n  2\n")
    code = f"""
        import json
        from ledger.core.errors import ConfigError
        from resources.config.transforms import load_transform
        load_transform({str(first)!r} + ":transform")
        try:
            load_transform({str(tmp_path / "conf" / "b" / "orders_transform.py")!r} + ":transform")
            print(json.dumps({{"error": None}}))
        except ConfigError as exc:
            print(json.dumps({{"error": str(exc)}}))
        """
    result = _in_subprocess(code, cwd=tmp_path)
    assert result["error"] is not None
    assert "is already loaded from" in result["error"]
    assert str(first) in result["error"]


def test_the_transform_reaches_a_python_that_cannot_import_its_folder(tmp_path: Path) -> None:
    """Spark's Python workers (and a shared Connect server's) never get the config's folder on
    their path: the loaded module's code travels with the pickled function instead."""
    code = tmp_path / "conf" / "code"
    _write(code, "order_helpers.py", _HELPER)
    _write(code, "orders_transform.py", _PANDAS_TRANSFORM.format(helper="order_helpers"))
    path = _config(tmp_path, "code/orders_transform.py:transform")
    pickled = tmp_path / "function.pickle"
    _in_subprocess(
        f"""
        import json
        from pyspark import cloudpickle
        from resources.config.loading import load_config
        function = load_config({str(path)!r}).load_transform().pandas_function
        open({str(pickled)!r}, "wb").write(cloudpickle.dumps(function))
        print(json.dumps({{}}))
        """,
        cwd=tmp_path,
    )
    result = _in_subprocess(
        f"""
        import json, pickle
        import pandas as pd
        function = pickle.loads(open({str(pickled)!r}, "rb").read())
        out = function(pd.DataFrame({{"value": [b'{{"app": "web"}}', b"oops"]}}))
        print(json.dumps({{"app": list(out["app"]), "error": [e is None for e in out["_error"]]}}))
        """,
        cwd=REPO,
    )
    assert result == {"app": ["web", None], "error": [True, False]}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`exactly` as a user runs it: from the repository, with no PYTHONPATH at all."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "exactly_cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=env,
    )


def test_a_pandas_transform_beside_the_config_runs_on_spark_workers_exactly_once(
    kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """Through the real CLI, broker, Spark and Delta: the transform's folder is on no path
    Spark's Python workers have, yet every record lands once (its code travels by value)."""
    from jobs.examples.sample_data import pageviews
    from tests.fixtures.pipeline import assert_exactly_once, config_path

    base = pipeline_factory(2, max_records=200)
    path = config_path(base)
    code = path.parent / "transforms"
    _write(code, "order_helpers.py", _HELPER)
    _write(code, "orders_transform.py", _PANDAS_TRANSFORM.format(helper="order_helpers"))
    doc = yaml.safe_load(path.read_text())
    doc["transform"] = "orders_transform:transform"
    doc["python_path"] = ["transforms"]
    path.write_text(yaml.safe_dump(doc))
    kafka_client.produce(base.kafka.topic, [*pageviews(300), b"not json"])

    done = _cli("run", "-c", str(path), "--until-caught-up")
    assert done.returncode == 0, done.stderr
    assert assert_exactly_once(load_config(path), kafka_client) == (300, 1)

    doc["transform"] = "transforms/gql.py:transform"
    _write(code, "gql.py", "def transform(df):\n    return df\n")
    path.write_text(yaml.safe_dump(doc))
    refused = _cli("run", "-c", str(path), "--until-caught-up")
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "module 'gql'" in lines[0] and "rename it" in lines[0], lines
