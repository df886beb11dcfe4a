"""The acceptance report's verdict over its lines, and the files it writes: report.md and the
chart of each measured figure against its expectation (report.json is the lines as data).
"""

from __future__ import annotations

from pathlib import Path

from checks.acceptance_line import FAIL, NOT_APPLICABLE, PASS, STANDIN_SOURCE, UNREACHED, Line


def on_standins(lines: list[Line]) -> list[Line]:
    return [line for line in lines if line.source.startswith(STANDIN_SOURCE)]


def overall(lines: list[Line]) -> tuple[str, int]:
    """A machine is ACCEPTED only on its own answers: a run that a lab stand-in answered any line
    of is at best ACCEPTED ON STAND-INS, with an exit status of its own (4), never 0."""
    verdicts = {line.verdict for line in lines}
    if FAIL in verdicts:
        return "NOT ACCEPTED", 1
    if UNREACHED in verdicts:
        return "INCOMPLETE", 3
    if on_standins(lines):
        return "ACCEPTED ON STAND-INS", 4
    return "ACCEPTED", 0


def markdown(lines: list[Line], meta: dict) -> str:
    verdict = "INTERRUPTED" if meta.get("interrupted") else overall(lines)[0]
    counts = {v: sum(line.verdict == v for line in lines) for v in (PASS, FAIL, UNREACHED, NOT_APPLICABLE)}
    out = [
        f"# Acceptance report: {verdict}",
        "",
        f"Inventory `{meta['inventory']}`, started {meta['started']}, {meta['seconds']} s. "
        + ", ".join(f"{n} {v}" for v, n in counts.items())
        + "."
        + standins_sentence(lines, verdict)
        + (
            " The run was interrupted (Ctrl-C or SIGTERM): the lines it had not reached are missing; not accepted."
            if meta.get("interrupted")
            else ""
        ),
        "",
        "| verdict | area | host | expected | observed | answered by |",
        "|---|---|---|---|---|---|",
    ]
    cell = lambda text: str(text).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    for line in lines:
        out.append(
            f"| {line.verdict} | {cell(line.area)} | {cell(line.host)} | {cell(line.expectation)} | "
            f"{cell(line.observed)} | {cell(line.source)} |"
        )
    detailed = [line for line in lines if line.details]
    if detailed:
        out += ["", "## Details"]
        for line in detailed:
            out += ["", f"**{line.area}** ({line.host})", ""] + [f"- {cell(d)}" for d in line.details]
    out += [
        "",
        "UNREACHED lines could not be collected and are not counted as passed; N/A lines do not "
        "apply to this site. A line answered by a stand-in rehearses the collection, not the machine.",
    ]
    return "\n".join(out) + "\n"


def standins_sentence(lines: list[Line], verdict: str) -> str:
    named = on_standins(lines)
    if not named:
        return ""
    sentence = f" {len(named)} of {len(lines)} lines were answered by a lab stand-in (column 'answered by')"
    if verdict == "ACCEPTED ON STAND-INS":
        return sentence + ": this rehearses the collection and the judging; it accepts no machine."
    return sentence + "."


def draw_chart(lines: list[Line], path: Path) -> Path | None:
    """Each measured figure against its expectation (1.0 = as expected); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    measured = [line for line in lines if line.figure is not None and line.expected_figure]
    if not measured:
        return None
    figure, axes = plt.subplots(figsize=(8, 0.6 * len(measured) + 1.5))
    ratios = [
        got / expected for line in measured if (got := line.figure) is not None and (expected := line.expected_figure)
    ]
    colours = ["#2a7" if line.verdict == PASS else "#c33" if line.verdict == FAIL else "#999" for line in measured]
    labels = [f"{line.area} ({line.host})" for line in measured]
    axes.barh(labels, ratios, color=colours)
    axes.axvline(1.0, color="black", linewidth=1)
    for index, line in enumerate(measured):
        axes.text(ratios[index], index, f" {line.figure:g} / {line.expected_figure:g} {line.unit}", va="center")
    axes.set_xlabel("measured / expected")
    axes.set_title("inference-host acceptance: figures against their expectations")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
