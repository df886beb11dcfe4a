"""STAND-IN for NVIDIA DCGM 4 (datacenter-gpu-manager-4-*) in the lab's NVIDIA apt repository.

Package names, dependencies and the service come from NVIDIA/DCGM 4.6.0: cmake/packaging.cmake
(datacenter-gpu-manager-4-core holds dcgmi, nv-hostengine and the unit; -cuda12 / -cuda13 hold
the diagnostics built for that CUDA major and depend on -core of the same version) and
config-files/systemd/nvidia-dcgm.service.in; the version is 1:4.5.3-1, the DCGM dcgm-exporter 4.8.2
is built against (epoch 1: DCGM v4.5.3 CMakeLists.txt), as the deploy pins it. The programs are tiny
stand-ins: nv-hostengine just stays up; dcgmi answers like the real one (dcgmi/Command.cpp) when no host engine runs,
and otherwise prints `dcgmi diag`'s table (dcgmi/Diag.cpp's stencils, rendered by
render_diag below) or, with -j/--json, its JSON (render_diag_json below, which the unit
tests' samples share) with every test skipped: there is no GPU in the lab.
"""

from __future__ import annotations

import json

PROPRIETARY = "datacenter-gpu-manager-4-proprietary"
# Where Debian/Ubuntu packages put DCGM's modules (the core's list, above); the exporter stand-in
# looks for this file as the real host engine loads it.
PROFILING_MODULE = "/usr/lib/x86_64-linux-gnu/libdcgmmoduleprofiling.so.4"
DCGM_VERSION = "4.5.3"  # what dcgm-exporter 4.8.2 is built against (tag 4.5.3-4.8.2, hack/VERSION)

# dcgmi/Diag.cpp: DIAG_HEADER, DIAG_INFO, DIAG_DEPLOYMENT, DIAG_HARDWARE, ..., DIAG_FOOTER.
HEADER = (
    "+---------------------------+------------------------------------------------+\n"
    "| Diagnostic                | Result                                         |\n"
    "+===========================+================================================+\n"
)
SECTIONS = {
    "Metadata": "|-----  Metadata  ----------+------------------------------------------------|\n",
    "Deployment": "|-----  Deployment  --------+------------------------------------------------|\n",
    "Hardware": "+-----  Hardware  ----------+------------------------------------------------+\n",
    "Integration": "+-----  Integration  -------+------------------------------------------------+\n",
    "Stress": "+-----  Stress  ------------+------------------------------------------------+\n",
}
FOOTER = "+---------------------------+------------------------------------------------+\n"
NAME_WIDTH, INFO_WIDTH, PIECE = 25, 46, 45  # "<DATA_NAME ...>", "<DATA_INFO ...>", DATA_INFO_TAG_LEN


def _cell(value: str, width: int) -> str:
    """CommandOutputController::ReplaceTag: pad, or cut and end with '...'."""
    return value.ljust(width) if len(value) <= width else value[: width - 3] + "..."


def _row(name: str, info: str) -> str:
    return f"| {_cell(name, NAME_WIDTH)} | {_cell(info, INFO_WIDTH)} |\n"


def render_diag(metadata: dict[str, str], sections: dict[str, list[dict]]) -> str:
    """`dcgmi diag` output. sections: {"Deployment": [{"name", "result", "entities": {"GPU0":
    "Pass"}, "warnings": {"GPU1": "message"}}]} in display order."""
    out = ["Successfully ran diagnostic for group.\n", HEADER, SECTIONS["Metadata"]]
    out += [_row(k, v) for k, v in metadata.items()]
    for section, tests in sections.items():
        out.append(SECTIONS[section])
        for test in tests:
            out.append(_row(test["name"], test["result"]))
            for entity, result in test.get("entities", {}).items():
                out.append(_row("", f"{entity}: {result}"))
                message = test.get("warnings", {}).get(entity)
                if message:  # Diag::DisplayVerboseInfo: 45-character pieces, the name once
                    for start in range(0, len(message), PIECE):
                        label = f"Warning: {entity}" if start == 0 else ""
                        out.append(_row(label, message[start : start + PIECE]))
    out.append(FOOTER)
    return "".join(out)


# dcgmfields: DCGM_FE_GPU = 1, DcgmFieldsGetEntityGroupString -> "GPU".
ENTITY_GROUPS = {"GPU": 1}


def render_diag_json(
    metadata: dict[str, str], categories: dict[str, list[dict]], entities: dict[str, str] | None = None
) -> str:
    """`dcgmi diag -j` output as DCGM 4.6.0 builds it (dcgmi/Diag.cpp HelperJsonBuildOutput; key
    names from nvvs/include/NvvsJsonStrings.h): categories {"Deployment": [{"name", "summary":
    "Pass", "results": {"GPU0": "Pass"}, "warnings": {"GPU1": [(error_id, category, severity,
    message)]}, "info": {"GPU0": ["..."]}}]}; entities {"0": "<device id>"}. A "Not Run" result
    is left out (HelperJsonAddResult); the summary lists every error of the test. jsoncpp's
    toStyledString sorts keys and indents by 3 with " : "."""

    def warnings(items):
        return [{"warning": m, "error_id": i, "error_category": c, "error_severity": sev} for i, c, sev, m in items]

    out: dict = {"DCGM Diagnostic": {}, "metadata": dict(metadata)}
    if entities:
        out["entity_groups"] = [
            {
                "entity_group": "GPU",
                "entity_group_id": ENTITY_GROUPS["GPU"],
                "entities": [{"entity_id": int(k), "device_id": v} for k, v in entities.items()],
            }
        ]
    rendered = []
    for category, tests in categories.items():
        entries = []
        for test in tests:
            entry: dict = {"name": test["name"]}
            for entity, status in test.get("results", {}).items():
                if status == "Not Run":
                    continue
                group = entity.rstrip("0123456789")
                result = {
                    "entity_group": group,
                    "entity_group_id": ENTITY_GROUPS[group],
                    "entity_id": int(entity[len(group) :]),
                    "status": status,
                }
                if test.get("warnings", {}).get(entity):
                    result["warnings"] = warnings(test["warnings"][entity])
                if test.get("info", {}).get(entity):
                    result["info"] = list(test["info"][entity])
                entry.setdefault("results", []).append(result)
            if test["summary"] != "Not Run":
                summary = {"status": test["summary"]}
                every = [w for items in test.get("warnings", {}).values() for w in items]
                if every:
                    summary["warnings"] = warnings(every)
                entry["test_summary"] = summary
            entries.append(entry)
        rendered.append({"category": category, "tests": entries})
    out["DCGM Diagnostic"]["test_categories"] = rendered
    return json.dumps(out, indent=3, sort_keys=True, separators=(",", " : ")) + "\n"


def render_diag_runtime_error(message: str) -> str:
    """Diag::HelperDisplayFailureMessage with -j: the run could not start."""
    return (
        json.dumps(
            {"DCGM Diagnostic": {"runtime_error": message, "version": DCGM_VERSION}},
            indent=3,
            sort_keys=True,
            separators=(",", " : "),
        )
        + "\n"
    )


NV_HOSTENGINE = """#!/bin/sh
# STAND-IN nv-hostengine (inference-host lab): DCGM's host engine; with no GPU it only stays up.
echo $$ > /run/nv-hostengine.pid
exec sleep infinity
"""


def _dcgmi() -> str:
    skipped = render_diag({"DCGM Version": DCGM_VERSION}, {"Deployment": [{"name": "software", "result": "Skip"}]})
    skipped_json = render_diag_json(
        {"version": DCGM_VERSION}, {"Deployment": [{"name": "software", "summary": "Skip"}]}
    )
    return f"""#!/bin/sh
# STAND-IN dcgmi (inference-host lab). Without a running host engine it answers as
# dcgmi/Command.cpp does; `dcgmi diag` otherwise prints DCGM's table, or with -j/--json its
# JSON, with every test skipped (no GPU exists in the lab).
# Running is /proc/PID, not kill -0: any user reaches the real host engine (TCP on localhost:5555),
# and kill -0 is refused for another user's process (the periodic checks run as their own user).
pid=$(cat /run/nv-hostengine.pid 2>/dev/null)
if [ -z "$pid" ] || [ ! -d "/proc/$pid" ]; then
    echo "Error: unable to establish a connection to the specified host: localhost"
    echo "Error: Unable to connect to host engine. Host engine connection invalid/disconnected."
    exit 255
fi
case "$1" in
    --version|-v) echo "dcgmi  version: {DCGM_VERSION}"; exit 0 ;;
    diag)
        for arg in "$@"; do
            case "$arg" in -j|--json) cat <<'EOF'
{skipped_json}EOF
                exit 0 ;;
            esac
        done
        cat <<'EOF'
{skipped}EOF
        exit 0 ;;
esac
echo "dcgmi (stand-in): only diag and --version are provided in the lab" >&2
exit 1
"""


UNIT = """[Unit]
Description=NVIDIA DCGM service
After=nvidia-gpu-reset.target
Wants=nvidia-gpu-reset.target

[Service]
User=root
PrivateTmp=false
Environment="DCGM_HOME_DIR=/var/log/nvidia-dcgm"
ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm
Restart=on-abort

[Install]
Alias=dcgm.service
WantedBy=multi-user.target
"""


def dcgm_packages(package_cls) -> list:
    """datacenter-gpu-manager-4-core / -proprietary / -cuda12 / -cuda13 at 1:<version>-1 (packaging.cmake)."""
    version = f"1:{DCGM_VERSION}-1"
    core = "datacenter-gpu-manager-4-core"
    return [
        package_cls(
            core,
            version,
            depends=["libc6 (>= 2.27)"],
            files={
                "/usr/bin/dcgmi": (_dcgmi(), 0o755),
                "/usr/bin/nv-hostengine": (NV_HOSTENGINE, 0o755),
                "/lib/systemd/system/nvidia-dcgm.service": (UNIT, 0o644),
            },
        ),
        # The profiling module DCGM_FI_PROF_* need: the host engine loads libdcgmmoduleprofiling.so.4
        # (NVIDIA/DCGM v4.5.3 dcgmlib/src/DcgmHostEngineHandler.cpp), which -core does not hold
        # (scripts/verify_package_contents/datacenter-gpu-manager-core_amd64.deb.txt lists every
        # other module); NVIDIA ships it closed-source in -proprietary at the core's version, which
        # dcgm-exporter's own image installs beside -core (NVIDIA/dcgm-exporter PR #456).
        package_cls(
            PROPRIETARY,
            version,
            depends=[f"{core} (= {version})"],
            files={PROFILING_MODULE: (b"STAND-IN: no profiling module exists in the lab\n", 0o644)},
        ),
        package_cls("datacenter-gpu-manager-4-cuda12", version, depends=[f"{core} (= {version})"]),
        package_cls("datacenter-gpu-manager-4-cuda13", version, depends=[f"{core} (= {version})"]),
    ]
