"""Text that names the repository stays true: every repository path (roles/..., checks/...,
lab/..., docs/..., tests/..., inventory/..., group_data/...) named in a tracked file -- a
comment, a docstring, a document, a README -- exists; so does every dotted module path of ours
(roles.serving.cli_capture, checks.bench.main); every `<document>.md#<section>` names a
heading that exists; and every engine script named is one the deploy installs (the `sglang-*`
scripts were renamed `inference-engine-*`; the old names appear only where the migration removes
them). A rename that leaves its old name in prose fails here, not in a newcomer's head."""

from __future__ import annotations

import posixpath
import re

from roles.shared.legacy_layout import LEGACY_SCRIPTS
from tests.unit.conftest import PROJECT_ROOT
from tests.unit.test_docs import anchors
from tests.unit.test_layout import _tracked_texts

GUARD = "tests/unit/test_stale_names.py"  # plants stale names to show they are caught
# Copies of upstream files and output captured from real tools: their paths are not ours.
NOT_OURS = ("tests/unit/data/",)

TOPS = ("roles", "checks", "lab", "docs", "tests", "inventory", "group_data")
# A relative path starting at one of our top folders. Not after '/', '.', '@', ':' or '~': an
# absolute path on the target host (/opt/inference-host/checks/...), a URL's path
# (github.com/.../docs/...) and a lab host name (`@lab/gpu`) are not repository paths.
PATH = re.compile(r"(?<![\w./@:~-])((?:" + "|".join(TOPS) + r")/[\w./<>{}*$-]*)")
WILDCARD = re.compile(r"[<>{}*$]")
# A suffix after a module's path that is an attribute (roles/serving.pcie_allreduce_env), unless
# it is one of these file extensions (then the path names a file, which must exist).
EXTENSIONS = {
    "py",
    "md",
    "rst",
    "yml",
    "yaml",
    "j2",
    "json",
    "txt",
    "toml",
    "sh",
    "cfg",
    "in",
    "lock",
    "patch",
    "tar",
    "service",
    "timer",
    "Dockerfile",
    "vault",
}

# Repository-looking paths that are not pointers at a file of this repository, each with why.
NOT_PATHS = {
    "inventory/x.py": "an example file name in a quoted error message (`inventory/x.py:12: NameError`)",
    "inventory/site.py": "the inventory the unit tests' factory writes into a tmp folder",
    "inventory/models": "the user's folder (and files in it) for the model configs; the document's commands make it",
    "tests/infra": "the checks' old place, named on purpose where the upgrade notes say what moved",
}
PLANTED = {("tests/unit/test_layout.py", name) for name in ("roles/x.py", "docs/a.md", "lab/standins/x.py")} | {
    ("tests/unit/test_docs.py", name) for name in ("README.md#no-such-heading", "README.md#a-heading")
}

DOC_ANCHOR = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w.-]+\.md)#([\w-]+)")
# A section named by its heading: (docs/upstream.md, "NCCL"); a heading that starts so must exist.
DOC_HEADING = re.compile(r'(?<![\w./-])((?:[\w.-]+/)*[\w.-]+\.md)\)?,? (?:under |section |in )?"([^"]+)"')
# Engine scripts the deploy installs: roles/serving/templates/inference-engine-<name>.j2; named
# one by one, as a family (`-*`) or a brace list (`-{switch,rolling}`).
SCRIPT = re.compile(r"(?<![\w.-])(inference-engine|sglang)-(\*|\{[a-z,-]+\}|[a-z][a-z-]*[a-z])")
# Names that share the prefix but are not scripts: the secret-args file.
NOT_SCRIPTS = {"secret-args"}
# Where the old script names are named on purpose: the list the migration removes, and the
# upgrade notes that say what was renamed.
OLD_NAMES_ON_PURPOSE = {"roles/shared/legacy_layout.py", "README.md", "docs/upgrades.md"}
# The service account's folders before their rename (roles/shared/legacy_account.py): named only
# where the migration moves them, where it is tested, and where the notes say what was renamed.
# With or without the leading '/': a preview's or a test's host path relative to the root
# (`var/lib/sglang/.cache`) is the same folder.
OLD_FOLDER = re.compile(r"(?<![\w.-])/?var/(?:lib|log)/sglang(?![\w.-])")
OLD_FOLDERS_ON_PURPOSE = {
    "roles/shared/legacy_account.py",
    "README.md",
    "docs/upgrades.md",
    "docs/testing.md",
    "roles/base/README.md",
    "tests/unit/test_account_migration.py",
    "tests/unit/plans/_fake.py",
    "tests/unit/plans/inventory_account_kept_ubuntu2404.py",
    "tests/lab/test_sglang_engine.py",
}


# A dotted module path of ours (roles.serving.cli_capture, checks.bench.main): the longest leading
# part that is a module must exist, and the next name must be one that module binds (a function, a
# class, an assignment, an import) or a module in its package. Not after '/', '.', '@', ':' or '~':
# a file name (inventory/lab.py) or a URL is not a module path.
DOTTED = re.compile(r"(?<![\w./@:~-])((?:roles|checks|lab|tests)(?:\.[A-Za-z_]\w*)+)")
# A name after a module that is a module's file name, not an attribute (`lab.py`, `checks.md`).
NOT_ATTRIBUTES = EXTENSIONS | {"pyc", "png", "svg", "html", "log", "xml", "prom", "example", "internal"}
# A placeholder in an example (`roles.shared.x`), not a name.
PLACEHOLDERS = {"x", "y", "X", "Y"}
# Dotted names that are not pointers at our modules, each with why.
NOT_MODULES = {
    "tests.infra": "the checks' old module, named on purpose where the upgrade notes say what moved",
    "roles.sglang": "the old role's module, named on purpose where the upgrade notes say what moved",
    "lab.over_ssh": "the lab's old helper, named on purpose where the upgrade notes say it is gone",
}


def _prose(name: str, text: str) -> list[tuple[int, str]]:
    """(first line, text) of what a file says in words: a Python file's comments and strings
    (its code's own variables, `checks.append(...)`, are not module paths), any other whole."""
    if not name.endswith(".py"):
        return [(1, text)]
    import io
    import tokenize

    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return [(1, text)]
    return [(t.start[0], t.string) for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING)]


def _module_file(parts: list[str], tracked: set[str]) -> str | None:
    base = "/".join(parts)
    for candidate in (base + ".py", base + "/__init__.py"):
        if candidate in tracked:
            return candidate
    return None


def _bound_names(path: str, tracked: set[str]) -> set[str]:
    """The names a module binds at its top level, and for a package the modules in it."""
    import ast

    tree = ast.parse((PROJECT_ROOT / path).read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).partition(".")[0] for alias in node.names)
    if path.endswith("/__init__.py"):
        folder = path.removesuffix("__init__.py")
        names.update(
            name[len(folder) :].partition("/")[0].removesuffix(".py") for name in tracked if name.startswith(folder)
        )
    return names


def stale_modules(texts: dict[str, str], tracked: set[str], bound=_bound_names) -> list[str]:
    """'file:line: dotted.path' for every module path of ours named that does not exist."""
    found = []
    for name, text in texts.items():
        if name == GUARD or name.startswith(NOT_OURS):
            continue
        for first, words in _prose(name, text):
            for match in DOTTED.finditer(words):
                if not _module_exists(match.group(1), tracked, bound):
                    found.append(f"{name}:{first + words.count(chr(10), 0, match.start())}: {match.group(1)}")
    return found


def _module_exists(ref: str, tracked: set[str], bound) -> bool:
    parts = ref.split(".")
    if any(ref == old or ref.startswith(old + ".") for old in NOT_MODULES):
        return True
    depth = max((n for n in range(1, len(parts) + 1) if _module_file(parts[:n], tracked)), default=0)
    module = _module_file(parts[:depth], tracked) if depth else None
    rest = parts[depth:]
    if not module:  # `lab.py`: a file's name
        return len(parts) == 2 and parts[1] in NOT_ATTRIBUTES
    return not rest or rest[0] in NOT_ATTRIBUTES | PLACEHOLDERS or rest[0] in bound(module, tracked)


def _folders(tracked: set[str]) -> set[str]:
    folders = set()
    for name in tracked:
        while "/" in name:
            name = name.rpartition("/")[0]
            folders.add(name)
    return folders


def _exists(ref: str, tracked: set[str], folders: set[str]) -> bool:
    wild = WILDCARD.search(ref)
    if wild:  # a pattern (roles/<role>/patches/...): the folder before the pattern must exist
        return ref[: wild.start()].rpartition("/")[0] in folders
    ref = ref.rstrip("/")
    if ref in tracked or ref in folders or ref + ".py" in tracked:  # a file, a folder, a module
        return True
    head, _, last = ref.rpartition("/")
    stem, dot, attribute = last.partition(".")
    module = f"{head}/{stem}"
    return (
        bool(dot)
        and attribute.isidentifier()
        and attribute not in EXTENSIONS
        and (module + ".py" in tracked or module in folders)
    )


def stale_paths(texts: dict[str, str], tracked: set[str]) -> list[str]:
    """'file:line: path' for every repository path named that does not exist."""
    folders = _folders(tracked)
    found = []
    for name, text in texts.items():
        if name == GUARD or name.startswith(NOT_OURS):
            continue
        for match in PATH.finditer(text):
            ref = match.group(1).rstrip(".-")
            if (
                any(ref == old or ref.startswith(old + "/") for old in NOT_PATHS)
                or (name, ref) in PLANTED
                or _exists(ref, tracked, folders)
            ):
                continue
            found.append(f"{name}:{text.count(chr(10), 0, match.start()) + 1}: {ref}")
    return found


def _document(name: str, ref: str, tracked: set[str]) -> str | None:
    folder = posixpath.dirname(name)
    for candidate in (posixpath.normpath(posixpath.join(folder, ref)), posixpath.normpath(ref)):
        if candidate in tracked:
            return candidate
    ends = sorted(path for path in tracked if path.endswith("/" + ref))
    return ends[0] if ends else None


def headings(path) -> list[str]:
    """The document's headings, lower case, outside code blocks."""
    found, in_code = [], False
    for line in path.read_text().splitlines():
        in_code ^= line.startswith("```")
        match = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*#*$", line)
        if match:
            found.append(match.group(1).lower())
    return found


def stale_sections(texts: dict[str, str], tracked: set[str]) -> list[str]:
    """'file:line: doc.md#anchor' (or 'doc.md "Heading"') for every section named that the
    document does not have."""
    found = []
    for name, text in texts.items():
        if name == GUARD or name.startswith(NOT_OURS):
            continue
        for match in DOC_HEADING.finditer(text):
            document = _document(name, match.group(1), tracked)
            # a quoted heading may wrap onto a comment's next line
            quoted = " ".join(re.sub(r"\n\s*#*", " ", match.group(2)).split()).lower()
            if document and not any(" ".join(h.split()).startswith(quoted) for h in headings(PROJECT_ROOT / document)):
                found.append(
                    f"{name}:{text.count(chr(10), 0, match.start()) + 1}: "
                    f'{match.group(1)} "{match.group(2)}" (no such heading in {document})'
                )
        for match in DOC_ANCHOR.finditer(text):
            document = _document(name, match.group(1), tracked)
            if document is None:  # a missing document: test_layout's guard names it
                continue
            if match.group(2) not in anchors(PROJECT_ROOT / document) and (name, match.group(0)) not in PLANTED:
                found.append(
                    f"{name}:{text.count(chr(10), 0, match.start()) + 1}: "
                    f"{match.group(1)}#{match.group(2)} (no such heading in {document})"
                )
    return found


def stale_scripts(texts: dict[str, str], scripts: set[str]) -> list[str]:
    """'file:line: name' for an engine script that is not installed, or an old script name."""
    found = []
    for name, text in texts.items():
        if name == GUARD or name.startswith(NOT_OURS):
            continue
        for match in SCRIPT.finditer(text):
            prefix, script = match.groups()
            line = text.count("\n", 0, match.start()) + 1
            listed = set(script.strip("{}").split(","))
            if prefix == "inference-engine" and script != "*" and not listed <= scripts | NOT_SCRIPTS:
                found.append(f"{name}:{line}: {match.group(0)} (no such script)")
            elif (
                prefix == "sglang"
                and (script == "*" or {f"sglang-{s}" for s in listed} & set(LEGACY_SCRIPTS))
                and name not in OLD_NAMES_ON_PURPOSE
            ):
                found.append(f"{name}:{line}: {match.group(0)} (an old name: now inference-engine-{script})")
    return found


def stale_folders(texts: dict[str, str]) -> list[str]:
    """'file:line: folder' for the service account's old folders named outside the places that
    name them on purpose (now /var/lib/inference-engine and /var/log/inference-engine)."""
    found = []
    for name, text in texts.items():
        if name == GUARD or name.startswith(NOT_OURS) or name in OLD_FOLDERS_ON_PURPOSE:
            continue
        for match in OLD_FOLDER.finditer(text):
            found.append(f"{name}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)} (an old name)")
    return found


def installed_scripts() -> set[str]:
    templates = (PROJECT_ROOT / "roles" / "serving" / "templates").glob("inference-engine-*.j2")
    return {path.name.removeprefix("inference-engine-").removesuffix(".j2") for path in templates}


def test_every_repository_path_named_in_the_tracked_files_exists():
    texts = _tracked_texts()
    found = stale_paths(texts, set(texts))
    assert found == [], "paths that are not in the repository:\n" + "\n".join(found)


def test_every_module_path_named_in_the_tracked_files_exists():
    texts = _tracked_texts()
    found = stale_modules(texts, set(texts))
    assert found == [], "module paths that are not in the repository:\n" + "\n".join(found)


def test_every_document_section_named_in_the_tracked_files_exists():
    texts = _tracked_texts()
    found = stale_sections(texts, set(texts))
    assert found == [], "\n".join(found)


def test_every_engine_script_named_is_one_the_deploy_installs():
    scripts = installed_scripts()
    assert {"switch", "rolling", "cleanup", "wait-ready"} <= scripts
    found = stale_scripts(_tracked_texts(), scripts)
    assert found == [], "\n".join(found)


def test_the_service_accounts_old_folders_are_named_only_on_purpose():
    found = stale_folders(_tracked_texts())
    assert found == [], "\n".join(found)


def test_the_guard_sees_stale_paths_sections_and_scripts():
    tracked = {
        "README.md",
        "checks/textfile.py",
        "roles/serving/__init__.py",
        "roles/site/weights.py",
        "roles/shared/layout.py",
        "inventory/locks/smg-1.13.0.txt",
    }
    text = (
        "# Usage\n"
        "see roles/monitoring/textfile.py and checks/textfile.py; roles/site/weights and\n"
        "roles/shared/layout.secret_args_link; inventory/locks/smg-<version>.txt, roles/<role>/x.py;\n"
        "not /opt/inference-host/checks/x.py nor `@lab/gpu`; roles/serving.md; docs/gone/\n"
    )
    assert stale_paths({"roles/a.py": text}, tracked) == [
        "roles/a.py:2: roles/monitoring/textfile.py",
        "roles/a.py:4: roles/serving.md",
        "roles/a.py:4: docs/gone/",
    ]
    # sections are read from the real README
    assert sorted(
        stale_sections(
            {
                "group_data/all.py": "# see README" + ".md#the-lab-path and README" + ".md#no-such\n"
                "# (README" + '.md, "The lab") and (README' + '.md, "The\n# lab path"), README' + '.md under "Settings"'
            },
            {"README.md"},
        )
    ) == [
        "group_data/all.py:1: README" + ".md#no-such (no such heading in README.md)",
        "group_data/all.py:3: README" + '.md "Settings" (no such heading in README.md)',
    ]
    scripts = {"switch", "rolling"}
    assert stale_scripts(
        {
            "roles/b.py": "sglang-" + "switch, inference-engine-" + "gone, sglang-" + "*, "
            "inference-engine-switch, inference-engine-secret-args.yaml, sglang-kernel, "
            "inference-engine-{switch,rolling}, inference-engine-{switch,gone}"
        },
        scripts,
    ) == [
        "roles/b.py:1: sglang-switch (an old name: now inference-engine-switch)",
        "roles/b.py:1: inference-engine-gone (no such script)",
        "roles/b.py:1: sglang-* (an old name: now inference-engine-*)",
        "roles/b.py:1: inference-engine-{switch,gone} (no such script)",
    ]
    assert stale_folders(
        {
            "roles/c.py": "HF_HOME=/var/lib/" + "sglang/.cache, /var/log/" + "sglang-x, /var/lib/inference-engine",
            "docs/upgrades.md": "/var/lib/" + "sglang",
            "tests/unit/test_x.py": 'assert not (out / "var/lib/' + 'sglang/.cache").exists()',
        }
    ) == [
        "roles/c.py:1: /var/lib/" + "sglang (an old name)",
        "tests/unit/test_x.py:1: var/lib/" + "sglang (an old name)",
    ]
    # dotted module paths: the module must exist, and the name after it must be one it binds
    modules = {"roles/__init__.py", "roles/serving/__init__.py", "roles/serving/cli_capture.py", "checks/bench.py"}
    names = {"roles/serving/cli_capture.py": {"capture"}, "checks/bench.py": {"main"}}

    def bound(path, tracked):
        return names.get(path, set()) | ({"serving"} if path == "roles/__init__.py" else set())

    assert stale_modules(
        {
            "roles/d.py": "# roles.engine_envs." + "cli_capture, roles.serving.cli_capture, checks.bench.main\n"
            "'roles.serving.cli_capture.gone' and checks.bench.py; checks = []; checks.append(1)\n",
            "docs/e.md": "    uv run python -m checks." + "gone\n    see inventory/lab.py and lab.py\n",
        },
        modules,
        bound,
    ) == [
        "roles/d.py:1: roles.engine_envs." + "cli_capture",
        "roles/d.py:2: roles.serving.cli_capture.gone",
        "docs/e.md:1: checks." + "gone",
    ]
