"""The EAGLE-3 training job off root (issue 53; roles/eagle3_training/privileges.py): its unit runs
as its own user in a sandbox; what needs root goes through the root helper's fixed verbs, which
the polkit rule opens to that user and nothing else; the helper refuses any other verb, and takes
from the job's folder only the job's own regular files; the job reads its own copy of the client
key, never the engine's --config file."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from roles import eagle3_training as job
from roles.eagle3_training import privileges
from roles.eagle3_training.files import engine_control, engine_helper, pipeline
from roles.shared import templates
from tests.unit import systemd_verify
from tests.unit.test_eagle3_training import cfg, host  # noqa: F401  (fixtures)

NODE = shutil.which("node")


def _rendered(settings) -> dict[str, str]:
    return {dest: templates.render(template, **kwargs) for dest, template, _, kwargs in job.rendered(settings)}


def _directives(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def test_the_job_runs_as_its_own_user_in_a_sandbox(host):  # noqa: F811
    unit = _directives(_rendered(host)["/etc/systemd/system/inference-host-eagle3@.service"])
    work = host.eagle3_training.work_dir
    assert unit["User"] == [privileges.JOB_USER] and unit["Group"] == [privileges.JOB_USER]
    assert privileges.JOB_USER not in (host.base.service_user, "inference-host-checks", "smg", "root")
    assert unit["SupplementaryGroups"] == [host.base.service_group]  # reads the model folder
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
        "DevicePolicy": "closed",
        "DeviceAllow": "char-nvidia* rw",
    }.items():
        assert unit[key] == [value], key
    assert unit["ReadWritePaths"] == [work] and f"HOME={work}" in unit["Environment"]


def test_the_helper_is_root_with_two_capabilities_and_writes_only_its_folders(host):  # noqa: F811
    unit = _directives(_rendered(host)["/etc/systemd/system/inference-host-eagle3-engine@.service"])
    assert "User" not in unit  # root, for the reason its template gives
    assert unit["CapabilityBoundingSet"] == ["CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH"]
    assert unit["PrivateNetwork"] == ["yes"] and unit["NoNewPrivileges"] == ["yes"]
    export_parent = str(Path(host.eagle3_training.export_dir).parent)
    assert unit["ReadWritePaths"] == [f"-/etc/systemd/system/inference-engine.service.d -{export_parent}"]
    assert unit["ExecStart"][0].endswith("engine_helper.py --config /etc/inference-host/eagle3-training.json %i")


@pytest.mark.skipif(not systemd_verify.AVAILABLE, reason="systemd-analyze is not installed")
def test_both_units_verify(host, tmp_path):  # noqa: F811
    rendered = _rendered(host)
    units = {
        "/etc/systemd/system/inference-host-eagle3@train.service": rendered[f"/etc/systemd/system/{job.UNIT}"],
        "/etc/systemd/system/inference-host-eagle3-engine@stop.service": rendered[
            "/etc/systemd/system/inference-host-eagle3-engine@.service"
        ],
    }
    assert systemd_verify.verify(units, tmp_path) == []


# -- the polkit rule ----------------------------------------------------------------------------------

# polkitd's rules run in Duktape (polkit 121+: Debian 12's 122, Ubuntu 24.04's 124), an ES5.1
# engine; the harness gives a rule what polkitd's init.js does (polkit.addRule, polkit.Result,
# action.lookup of the details systemd passes) and answers what the first rule that decides says.
HARNESS = r"""
var fs = require("fs");
var rules = [];
var polkit = {Result: {NO: "no", YES: "yes", AUTH_ADMIN: "auth_admin", NOT_HANDLED: null},
              addRule: function (rule) { rules.push(rule); }, log: function () {}};
new Function("polkit", fs.readFileSync(process.argv[1], "utf8"))(polkit);
var cases = JSON.parse(fs.readFileSync(0, "utf8"));
console.log(JSON.stringify(cases.map(function (c) {
    var action = {id: c.id, lookup: function (key) { return c.details[key]; }};
    var subject = {user: c.user, groups: [], isInGroup: function () { return false; }};
    for (var i = 0; i < rules.length; i++) {
        var answer = rules[i](action, subject);
        if (answer !== undefined && answer !== null) { return answer; }
    }
    return "defaults";
})));
"""
MANAGE = privileges.MANAGE_UNITS


def _case(unit: str, verb: str = "start", user: str = privileges.JOB_USER, action: str = MANAGE) -> dict:
    return {"id": action, "user": user, "details": {"unit": unit, "verb": verb}}


ALLOWED = [_case(unit) for unit in privileges.helper_units()]
REFUSED = [
    _case("inference-engine.service", "stop"),
    _case("inference-engine.service", "start"),
    _case("inference-engine.service", "restart"),
    _case("inference-host-eagle3-engine@bogus.service"),
    _case("inference-host-eagle3-engine@stop.service", "restart"),
    _case("inference-host-eagle3-engine@stop.service", "stop"),
    _case("inference-host-eagle3@train.service"),  # its own unit: root starts the steps
    _case("inference-host-eagle3-engine@stop.service", user="inference"),  # the engine's account
    _case("inference-host-eagle3-engine@stop.service", user="inference-host-checks"),
    _case("inference-host-eagle3-engine@stop.service", action="org.freedesktop.systemd1.manage-unit-files"),
    _case("inference-host-eagle3-engine@stop.service", action="org.freedesktop.systemd1.reload-daemon"),
]


def evaluate(rule: str, cases: list[dict], tmp_path: Path) -> list[str]:
    path = tmp_path / "rule.js"
    path.write_text(rule)
    assert NODE  # the callers skip without it
    result = subprocess.run(
        [NODE, "-e", HARNESS, str(path)], input=json.dumps(cases), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _rule(host) -> str:  # noqa: F811
    return _rendered(host)[privileges.POLKIT_RULE]


def test_the_rule_is_es5_as_duktape_reads_it(host):  # noqa: F811
    """No arrow functions, let/const, template strings or includes(): Duktape 2 is ES5.1."""
    code = "\n".join(line for line in _rule(host).splitlines() if not line.lstrip().startswith("//"))
    assert not re.search(r"=>|\blet\b|\bconst\b|`|\.includes\(", code), code
    assert json.dumps(privileges.JOB_USER) in code and json.dumps(privileges.helper_units()) in code


@pytest.mark.skipif(not NODE, reason="node is not installed (evaluates the polkit rule)")
def test_the_rule_allows_the_helpers_verbs_to_the_job_and_nothing_else(host, tmp_path):  # noqa: F811
    answers = evaluate(_rule(host), ALLOWED + REFUSED, tmp_path)
    assert answers[: len(ALLOWED)] == ["yes"] * len(ALLOWED)
    refused = answers[len(ALLOWED) :]
    assert refused == ["defaults"] * len(REFUSED), list(zip(REFUSED, refused, strict=True))


@pytest.mark.skipif(not NODE, reason="node is not installed (evaluates the polkit rule)")
def test_a_rule_that_forgets_the_unit_list_is_caught(host, tmp_path):  # noqa: F811
    """The check on a planted fault: the unit condition dropped lets the job stop the engine."""
    planted = re.sub(r"\[[^\]]*\]\.indexOf\(action\.lookup\(\"unit\"\)\) >= 0", "true", _rule(host))
    assert planted != _rule(host)
    assert evaluate(planted, [_case("inference-engine.service")], tmp_path) == ["yes"]


# -- the helper's fixed interface ---------------------------------------------------------------------


def test_the_role_the_job_and_the_helper_name_the_same_verbs():
    assert privileges.VERBS == engine_control.VERBS and privileges.HELPER_UNIT == engine_control.HELPER_UNIT


@pytest.mark.parametrize("verb", ["bogus", "stop;reboot", "../stop", "", "STOP", "restart"])
def test_the_helper_refuses_any_other_verb(verb, tmp_path, capsys):
    config = tmp_path / "job.json"
    config.write_text("{}")  # never read: the verb is refused first
    assert engine_helper.main(["--config", str(config), "--", verb]) == 2
    assert f"refused: {verb!r} is not one of stop, baseline, candidate, restore, publish" in capsys.readouterr().err
    with pytest.raises(ValueError, match="is not a verb of"):
        engine_control.helper_argv(verb)


def _staged(cfg: dict) -> Path:  # noqa: F811
    draft = pipeline.draft_config(cfg)
    staged = Path(cfg["work_dir"]) / "export"
    staged.mkdir(parents=True)
    (staged / "config.json").write_text(json.dumps(draft))
    (staged / "model.safetensors").write_bytes(b"weights")
    return staged


@pytest.fixture
def as_job_user(monkeypatch):
    monkeypatch.setattr(engine_helper, "job_uid", lambda config: os.getuid())


def test_publish_swaps_the_export_in_and_keeps_the_one_it_replaced(cfg, as_job_user):  # noqa: F811
    export = Path(cfg["export_dir"])
    _staged(cfg)
    engine_helper.act(cfg, "publish")
    assert (export / "model.safetensors").read_bytes() == b"weights"
    assert oct(export.stat().st_mode & 0o777) == "0o755"
    assert oct((export / "config.json").stat().st_mode & 0o777) == "0o644"
    (Path(cfg["work_dir"]) / "export" / "model.safetensors").write_bytes(b"weights 2")
    engine_helper.act(cfg, "publish")
    assert (export / "model.safetensors").read_bytes() == b"weights 2"
    assert (export.with_name(export.name + ".previous") / "model.safetensors").read_bytes() == b"weights"
    assert not export.with_name(export.name + ".publishing").exists()


def test_publish_follows_no_link_the_job_planted(cfg, as_job_user, tmp_path):  # noqa: F811
    secret = tmp_path / "root-only"
    secret.write_text("not the job's")
    staged = _staged(cfg)
    (staged / "model.safetensors").unlink()
    (staged / "model.safetensors").symlink_to(secret)
    with pytest.raises(engine_helper.HelperError, match="model.safetensors: Too many levels of symbolic links"):
        engine_helper.act(cfg, "publish")
    shutil.rmtree(staged)
    staged.symlink_to(tmp_path)  # the staged folder itself a link
    with pytest.raises(OSError):
        engine_helper.act(cfg, "publish")
    assert not Path(cfg["export_dir"]).exists()


def test_publish_takes_only_the_jobs_own_files(cfg, monkeypatch):  # noqa: F811
    _staged(cfg)
    monkeypatch.setattr(engine_helper, "job_uid", lambda config: os.getuid() + 1)  # the files: another owner
    with pytest.raises(engine_helper.HelperError, match="not a regular file of inference-host-eagle3's"):
        engine_helper.act(cfg, "publish")
    assert not Path(cfg["export_dir"]).exists()


def test_publish_refuses_code_for_the_engine_and_a_drafter_that_does_not_fit(cfg, as_job_user):  # noqa: F811
    staged = _staged(cfg)
    draft = json.loads((staged / "config.json").read_text())
    (staged / "config.json").write_text(json.dumps({**draft, "auto_map": {"AutoConfig": "evil.Config"}}))
    with pytest.raises(engine_helper.HelperError, match="without auto_map"):
        engine_helper.act(cfg, "publish")
    (staged / "config.json").write_text(json.dumps({**draft, "vocab_size": 129280}))
    with pytest.raises(engine_helper.HelperError, match="does not fit the target"):
        engine_helper.act(cfg, "publish")
    assert not Path(cfg["export_dir"]).exists()


def test_the_ab_variants_are_the_deployed_command_with_only_the_drafter_changed(cfg, monkeypatch, tmp_path):  # noqa: F811
    launcher = tmp_path / "launch"
    deployed = ["/opt/env/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/K"]
    speculative = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/old"]
    launcher.write_text(f"#!/bin/sh\nexec {' '.join(deployed + speculative)}\n")
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(engine_helper, "systemctl", lambda *args: calls.append(args))
    monkeypatch.setattr(engine_helper, "exec_start", lambda unit: str(launcher))
    monkeypatch.setattr(engine_helper, "dropin_dir", lambda config: tmp_path / "unit.d")
    Path(cfg["export_dir"]).mkdir(parents=True)
    engine_helper.act({**cfg, "current_drafter": None}, "baseline")
    assert (tmp_path / "unit.d" / engine_helper.LAUNCH).read_text().splitlines()[-1] == "exec " + " ".join(deployed)
    engine_helper.act(cfg, "candidate")
    launch = (tmp_path / "unit.d" / engine_helper.LAUNCH).read_text()
    assert f"--speculative-draft-model-path {cfg['export_dir']}" in launch
    assert calls[-1] == ("restart", "--", "inference-engine.service")
    engine_helper.act(cfg, "restore")
    assert sorted(p.name for p in (tmp_path / "unit.d").iterdir()) == []


# -- the client key ------------------------------------------------------------------------------------


def test_the_job_reads_its_own_copy_of_the_client_key(cfg, tmp_path):  # noqa: F811
    key = tmp_path / "api-key.json"
    config = {**cfg, "target": {**cfg["target"], "api_key_file": str(key)}}
    assert engine_control.api_key(config) is None  # no key set: none sent
    key.write_text(json.dumps({"api-key": "client-key"}))
    assert engine_control.api_key(config) == "client-key"
    # The engine's own --config shape with tenant keys (a list, the admin key beside it) is not
    # this file's: refused rather than sent as a word.
    key.write_text(json.dumps({"api-key": ["client-key", "tenant-key"], "admin-api-key": "admin"}))
    with pytest.raises(ValueError, match="api-key is not a non-empty string"):
        engine_control.api_key(config)


def test_the_wrapper_refuses_to_run_a_step_as_root(cfg, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Root would leave root's files in the job's folder and skip the unit's sandbox."""
    config = tmp_path / "job.json"
    config.write_text(json.dumps(cfg))
    monkeypatch.setattr(pipeline.os, "geteuid", lambda: 0)
    assert pipeline.main(["--config", str(config), "run", "regenerate"]) == 2
    assert "refused as root" in capsys.readouterr().err
    assert not (Path(cfg["work_dir"]) / "logs").exists()
