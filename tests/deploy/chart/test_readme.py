"""The chart README's values table and Chart.yaml's metadata.

- the README's values table is what tools/chart_readme.py generates from values.yaml
  (a test failure means: run `python tools/chart_readme.py`);
- every value in values.yaml has a comment (the generator refuses one without);
- the table names every top-level section of the schema;
- Chart.yaml carries home, icon, sources, keywords, maintainers and annotations.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from types import ModuleType

import pytest
import yaml

from .conftest import CHART, ROOT


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_readme", ROOT / "tools/chart_readme.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chart_readme"] = module
    spec.loader.exec_module(module)
    return module


def test_the_readme_values_table_is_generated_from_values_yaml() -> None:
    tool = _tool()
    readme = (CHART / "README.md").read_text()
    assert tool.render(readme, (CHART / "values.yaml").read_text()) == readme, (
        "charts/rlslice/README.md is stale: run python tools/chart_readme.py"
    )


def test_a_value_without_a_comment_is_refused() -> None:
    tool = _tool()
    with pytest.raises(SystemExit, match=r"agent\.extra has no comment"):
        tool.values_table("agent:\n  # Documented.\n  enabled: true\n  extra: 1\n")


def test_the_table_covers_every_section_of_the_schema() -> None:
    table = _tool().values_table((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    for section in schema["properties"]:
        assert f"| `{section}" in table, section


def test_chart_yaml_carries_the_metadata_catalogs_show() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for field in (
        "home",
        "icon",
        "sources",
        "keywords",
        "maintainers",
        "annotations",
        "kubeVersion",
    ):
        assert chart.get(field), field
    assert chart["annotations"]["licenses"] == "Apache-2.0"
