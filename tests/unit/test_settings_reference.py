"""docs/settings.md is generated from the site model: every key has a meaning, and it is not stale."""

from __future__ import annotations

from roles.site import table
from roles.site.schema import SECTIONS, SITE_KEYS

COMMAND = "uv run python -m roles.site --settings > docs/settings.md"


def test_every_setting_has_a_description():
    assert table.missing_descriptions() == [], (
        "give these keys a Field(description=...) in its section (roles/site/sections/), then " + COMMAND
    )


def test_the_committed_reference_is_the_generated_one():
    assert table.REFERENCE.read_text() == table.settings_reference(), f"docs/settings.md is stale: {COMMAND}"


def test_the_reference_names_every_key_with_its_meaning_type_default_and_readers():
    text = table.settings_reference()
    for cls in SECTIONS:
        for name, field in cls.model_fields.items():
            key = cls.PREFIX + name
            assert f"**`{key}`**" in text
            entry = " ".join(text.split(f"**`{key}`**", 1)[1].split("\n- ", 1)[0].split())
            assert "default " in entry and "read by " in entry
            assert " ".join(field.description.split()).split()[0] in entry
    for key in SITE_KEYS:
        assert f"**`{key}`**" in text


def test_readers_are_found_in_the_source():
    readers = table.readers_of_keys()
    assert "serving" in readers["serving_port"] and "gateway" in readers["serving_port"]
    assert "serving" in readers["nccl_p2p_level"]  # through the unit's env template
    assert "weights" in readers["weights_verify"]  # through roles/site/weights' holder
    assert "lxc_guest" in readers["guest_cores"] and "kvm_guest" in readers["guest_cores"]
    assert readers["health_gpu_link"] == ("checks",)
    assert "checks" in readers["serving_speculative"]  # through HostSettings.speculative


def test_a_missing_description_is_reported(monkeypatch):
    field = SECTIONS[0].model_fields["service_user"]
    monkeypatch.setattr(field, "description", None)
    assert table.missing_descriptions() == ["base_service_user"]


def test_a_stale_reference_is_reported(tmp_path, monkeypatch):
    stale = tmp_path / "settings.md"
    stale.write_text(table.settings_reference().replace("Parallel file downloads.", "old text"))
    monkeypatch.setattr(table, "REFERENCE", stale)
    assert table.REFERENCE.read_text() != table.settings_reference()


def test_the_reference_says_what_a_rule_accepts():
    text = " ".join(table.settings_reference().split())
    assert "Valid: one of 'replicas', 'tensor_parallel'." in text
    assert "Valid: 1 to 65535." in text.split("**`serving_port`**", 1)[1].split("- **", 1)[0]


def test_read_by_names_the_real_readers():
    """A key read through a section's method (receivers_for), or by name from pyinfra's data
    (checks/connection.py's data.get("ssh_key")), or by pyinfra's own connector, has its readers."""
    readers = table.readers_of_keys()
    assert "monitoring" in readers["monitoring_critical_receivers"]
    assert "monitoring" in readers["monitoring_warning_receivers"]
    assert {"pyinfra", "checks"} <= set(readers["ssh_key"])
    assert {"pyinfra", "checks"} <= set(readers["ssh_user"])
    unread = sorted(key for key, who in readers.items() if not who)
    assert unread == [], f"read by nothing: {unread}"
