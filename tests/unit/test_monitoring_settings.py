"""The monitoring section and the monitors group: defaults, pins, and each bad input refused
with one message naming the field, the value and what is valid."""

from __future__ import annotations

import pytest

from roles.site import SiteError, load_site
from tests.unit.conftest import gpu_node


def monitor(name: str = "gpu1", **data):
    """The gpu node watching itself (the simplest site: its engine listens on 127.0.0.1)."""
    return (name, {"monitoring_webhook_url": "http://127.0.0.1:9099/alerts", **data})


def problems_of(path) -> list[str]:
    with pytest.raises(SiteError) as caught:
        load_site(path)
    return caught.value.problems


def test_a_monitors_group_with_defaults_is_valid(inventory):
    site = load_site(inventory.groups(gpu_nodes=[gpu_node()], monitors=[monitor()]))
    mon = site.hosts["gpu1"]
    assert mon.groups == ("gpu_nodes", "monitors")
    assert mon.monitoring.listen_address == "127.0.0.1" and mon.monitoring.retention_time == "30d"
    assert site.hosts["gpu1"].monitoring.check_interval_seconds == 300
    pins = site.stack.monitoring
    assert pins.for_distro("debian12")["prometheus"] == "2.42.0+ds-5+deb12u1"
    assert pins.dcgm_exporter == "4.8.2"


@pytest.mark.parametrize(
    "data, parts",
    [
        ({"monitoring_retention_time": "30 days"}, ["monitoring_retention_time = '30 days'", "a Prometheus duration"]),
        ({"monitoring_check_cpu_quota_percent": 0}, ["monitoring_check_cpu_quota_percent = 0", "1 to 100"]),
        ({"monitoring_listen_address": "all"}, ["monitoring_listen_address = 'all'", "an IP address"]),
        ({"monitoring_webhook_url": "ftp://x"}, ["monitoring_webhook_url = 'ftp://x'", "http(s) URL"]),
        ({"monitoring_listen_address": "0.0.0.0"}, ["monitoring_listen_address = '0.0.0.0'", "basic auth"]),
        ({"monitoring_webhook_url": None}, ["no receiver", "monitoring_webhook_url"]),
        (
            {"monitoring_email_to": "ops@example.org"},
            ["monitoring_email_to = 'ops@example.org'", "monitoring_email_smarthost"],
        ),
        ({"monitoring_web_password_secret": "prom_pw"}, ["monitoring_web_password_secret = 'prom_pw'", "no secret"]),
        ({"monitoring_retention": "30d"}, ["unknown key monitoring_retention", "monitoring_retention_time"]),
    ],
)
def test_bad_monitoring_settings_are_named(inventory, data, parts):
    problems = problems_of(inventory.groups(gpu_nodes=[gpu_node()], monitors=[monitor(**data)]))
    assert len(problems) == 1, problems
    for part in parts:
        assert part in problems[0], (part, problems[0])


def test_the_checks_must_finish_within_their_interval(inventory):
    path = inventory.groups(
        gpu_nodes=[gpu_node(monitoring_check_interval="1m", monitoring_check_timeout_s=90)], monitors=[monitor()]
    )
    (problem,) = problems_of(path)
    assert "monitoring_check_timeout_s = 90" in problem and "'1m'" in problem


def test_a_monitors_group_needs_the_pins(inventory):
    text = (inventory.dir / "stack.yml").read_text()
    inventory.stack(text.split("\nmonitoring:")[0] + "\n")
    assert load_site(inventory.groups(gpu_nodes=[gpu_node()]))  # no monitors: no pins needed
    (problem,) = problems_of(inventory.groups("monitored.py", gpu_nodes=[gpu_node()], monitors=[monitor()]))
    assert "monitoring package pins" in problem


def test_a_pin_that_is_no_apt_version_is_named(inventory):
    inventory.edit_stack('prometheus: "2.42.0+ds-5+deb12u1"', "prometheus: latest")
    (problem,) = problems_of(inventory.groups(gpu_nodes=[gpu_node()], monitors=[monitor()]))
    assert "monitoring.debian12.prometheus = 'latest'" in problem and "exact apt version" in problem


def test_an_exporter_pin_with_no_declared_dcgm_is_named(inventory):
    """The old apt-version form (4.8.2-1) and unknown releases: the pin is the upstream version whose
    DCGM pairing is declared (DCGM_FOR_EXPORTER)."""
    for value in ("4.8.2-1", "4.9.0"):
        inventory.edit_stack('dcgm_exporter: "4.8.2"', f'dcgm_exporter: "{value}"')
        (problem,) = problems_of(inventory.groups(gpu_nodes=[gpu_node()], monitors=[monitor()]))
        assert f"monitoring.dcgm_exporter = '{value}'" in problem and "one of 4.8.2" in problem, problem
        inventory.edit_stack(f'dcgm_exporter: "{value}"', 'dcgm_exporter: "4.8.2"')


def test_the_password_secret_must_be_in_the_vault(inventory):
    vault = inventory.vault(prom_pw="s3cret")
    site = load_site(
        inventory.groups(
            gpu_nodes=[gpu_node(secrets_file=vault)],
            monitors=[
                monitor(
                    secrets_file=vault, monitoring_web_password_secret="prom_pw", monitoring_listen_address="0.0.0.0"
                )
            ],
        )
    )
    assert site.hosts["gpu1"].monitoring.web_password_secret == "prom_pw"


def test_a_monitor_on_another_host_cannot_scrape_loopback_addresses(inventory):
    problems = problems_of(
        inventory.groups(gpu_nodes=[gpu_node(monitoring_exporter_address="127.0.0.1")], monitors=[monitor("mon1")])
    )
    assert len(problems) == 2, problems
    assert all("cannot be scraped by the monitors host mon1" in p for p in problems)
    assert "monitoring_exporter_address = '127.0.0.1'" in problems[0] and "serving_host = '127.0.0.1'" in problems[1]
