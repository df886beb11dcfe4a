"""The README is the front door: keep its settings table and quickstart true."""

from __future__ import annotations

from roles.site import settings_table
from tests.unit.conftest import PROJECT_ROOT

README = (PROJECT_ROOT / "README.md").read_text()


def test_settings_table_matches_the_site_model():
    start = README.index("<!-- settings:begin -->") + len("<!-- settings:begin -->")
    end = README.index("<!-- settings:end -->")
    assert README[start:end].strip() == settings_table().strip(), (
        "README.md's Settings table is out of date: replace it with `uv run python -m roles.site --settings`"
    )


def test_quickstart_has_the_two_commands():
    assert "uv run pyinfra -y inventory/lab.py deploy.py" in README
    assert "uv run pytest" in README
