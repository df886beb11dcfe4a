"""The import graph of roles/: the site model is a leaf, roles depend only on it and on the
shared helpers, and nothing imports in a circle. Read from the source with ast (every import,
also those inside functions), so a hidden in-function import counts like any other."""

from __future__ import annotations

import ast
import posixpath
import re
import subprocess
from pathlib import Path

from tests.unit.conftest import PROJECT_ROOT

MODEL, SHARED = "roles.site", "roles.shared"
# Above the roles, like deploy.py: composes them (the table of roles deploy.py runs; the preview,
# python -m roles.render, which records deploy.py with its recorder and stated state); no role
# imports them. The model's own command line (roles/site/__main__.py) is part of the model:
# validating an inventory with the roles' checks is validation.py's, above both.
COMPOSITION = {"roles.composition", "roles.render", "roles.recording", "roles.stated_state"}


def module_name(path: Path, project_root: Path) -> str:
    parts = list(path.relative_to(project_root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(name: str, modules: set[str]) -> str:
    """The module file an imported name lands in (a submodule, else its package)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _type_checking_only(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            lines |= {n.lineno for stmt in node.body for n in ast.walk(stmt) if hasattr(n, "lineno")}
    return lines


def import_graph(project_root: Path = PROJECT_ROOT) -> dict[str, set[str]]:
    """module of roles/ -> the project modules it imports (roles.*, and the project's others)."""
    sources = {module_name(p, project_root): p for p in (project_root / "roles").rglob("*.py")}
    modules = set(sources)
    graph: dict[str, set[str]] = {}
    for module, path in sources.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        targets = set()
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                base = node.module if node.level == 0 else _relative(module, path, node)
                # `from package import submodule` reaches the submodule, anything else the module.
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] in ("roles", "validation", "deploy", "lab", "tests", "inventory"):
                    resolved = _resolve(name, modules) if name.startswith("roles") else name.split(".")[0]
                    if resolved and resolved != module:
                        targets.add(resolved)
        graph[module] = targets
    return graph


def _relative(module: str, path: Path, node: ast.ImportFrom) -> str:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def layer(module: str) -> str:
    """'model', 'shared', 'role:<name>' or 'other' (a module outside roles/)."""
    if module in COMPOSITION:
        return "composition"
    if module == MODEL or module.startswith(MODEL + "."):
        return "model"
    if module == SHARED or module.startswith(SHARED + "."):
        return "shared"
    parts = module.split(".")
    if parts[0] == "roles" and len(parts) > 1:
        return f"role:{parts[1]}"
    return "other"


def violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        mine = layer(module)
        for target in sorted(targets):
            theirs = layer(target)
            if theirs == "composition" and mine != "composition":
                found.append(f"{module} imports {target}, which composes the roles")
            elif mine == "composition":
                continue
            elif theirs == "other":
                found.append(f"{module} imports {target}, which is outside roles/")
            elif mine == "model" and theirs != "model":
                found.append(f"{module} (the site model) imports {target}")
            elif mine == "shared" and theirs.startswith("role:"):
                found.append(f"{module} (a shared helper) imports the role {target}")
            elif mine.startswith("role:") and theirs.startswith("role:") and theirs != mine:
                found.append(f"{module} ({mine}) imports another role: {target}")
    return found + [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                found.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_roles_tree_follows_the_layers():
    graph = import_graph()
    assert "roles.site.schema" in graph and "roles.shared.pve" in graph and "roles.serving" in graph
    assert violations(graph) == []


def test_the_checker_sees_each_kind_of_violation(tmp_path):
    # Planted: a model -> role import inside a function, a role -> role import, a helper -> role
    # import, and a cycle; each must be reported.
    tree = tmp_path / "roles"
    for path, text in {
        "__init__.py": "",
        "site/__init__.py": "from roles.site.schema import X\n",
        "site/schema.py": "def f():\n    from roles.serving import command\n",
        "site/__main__.py": "from validation import ROLE_CHECKS\n",  # the model reaching up
        "shared/__init__.py": "",
        "shared/pve.py": "from roles.lxc_guest import guest_hostname\n",
        "serving/__init__.py": "from roles.engine_envs import env_dir\n",
        "serving/command.py": "from roles.site import HostSettings\n",
        "engine_envs/__init__.py": "from roles.engine_envs import facts\n",
        "engine_envs/facts.py": "import roles.engine_envs\n",
        "lxc_guest/__init__.py": "from roles.render import render\n",
        "render.py": "from roles.serving import command\n",
    }.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    graph = import_graph(tmp_path)
    found = "\n".join(violations(graph))
    assert "roles.site.schema (the site model) imports roles.serving.command" in found
    assert "roles.site.__main__ imports validation, which is outside roles/" in found
    assert "roles.shared.pve (a shared helper) imports the role roles.lxc_guest" in found
    assert "roles.serving (role:serving) imports another role: roles.engine_envs" in found
    assert "import cycle: roles.engine_envs -> roles.engine_envs.facts -> roles.engine_envs" in found
    assert "roles.lxc_guest imports roles.render, which composes the roles" in found
    assert "roles.render (" not in found  # the composition layer may import every role


# A document's name anywhere in the tracked files (a link, a comment, a path): it must be one of
# the repository's own, found beside the file that names it, from the root, or as the end of a
# tracked path. Prose is .md or .rst; other names (.py, .txt) are too often upstream's or data.
DOCUMENT_NAME = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w.-]+\.(?:md|rst))\b")
# Names that are not pointers at a document of this project, each with why.
NOT_POINTERS = {
    ("lab/standins/hf_hub/server.py", "original/README.md"): "a file of the stand-in's model repository",
    ("lab/standins/nvidia_apt_repo/dcgm_exporter.py", "packaging/README.md"): "upstream dcgm-exporter's file",
    **{("tests/unit/test_docs.py", name): "planted by the link tests" for name in ("missing.md", "doc.md", "code.md")},
    **{
        (name, "report.md"): "the acceptance report's own output file"
        for name in (
            "checks/acceptance.py",
            "checks/acceptance_report.py",
            "docs/health-and-benchmark.md",
            "tests/lab/test_acceptance.py",
            "tests/unit/test_acceptance.py",
        )
    },
}


GUARD = "tests/unit/test_layout.py"
STALE_NAMES_GUARD = "tests/unit/test_stale_names.py"  # plants stale names of its own


def documents_outside(texts: dict[str, str], tracked: set[str]) -> list[str]:
    """'file: name' for every document name in texts that is not a file of the repository."""
    found = []
    for name, text in texts.items():
        if name in (GUARD, STALE_NAMES_GUARD):  # name them only to plant or to exempt them
            continue
        folder = posixpath.dirname(name)
        for match in DOCUMENT_NAME.finditer(text):
            ref = match.group(1)
            candidates = {posixpath.normpath(posixpath.join(folder, ref)), posixpath.normpath(ref)}
            if candidates & tracked or any(path.endswith("/" + ref) for path in tracked) or (name, ref) in NOT_POINTERS:
                continue
            found.append(f"{name}: {ref}")
    return found


def _tracked_texts() -> dict[str, str]:
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=PROJECT_ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    texts = {}
    for name in filter(None, tracked):
        path = PROJECT_ROOT / name
        if not path.is_file() or name == "uv.lock":
            continue
        try:
            texts[name] = path.read_text()
        except UnicodeDecodeError:
            continue
    return texts


def test_no_file_points_at_a_document_outside_the_repository():
    texts = _tracked_texts()
    found = documents_outside(texts, set(texts))
    assert found == [], "documents that are not in the repository: " + ", ".join(found)


def test_the_guard_sees_any_document_name_that_is_not_in_the_repository():
    tracked = {"README.md", "docs/upstream.md", "checks/README.md", "checks/reference.yml"}
    planted = {
        "checks/README.md": "figures (`checks/reference.yml`, from target-host" + ".md: vLLM 82.5)",
        "roles/x.py": "# see reference/serving" + ".md and (DESIGN" + ".md, house style)",
        "docs/a.md": "[ok](upstream.md), [ok too](../README.md#usage), docs/upstream.md, README.md",
    }
    assert documents_outside(planted, tracked) == [
        "checks/README.md: target-host" + ".md",
        "roles/x.py: reference/serving" + ".md",
        "roles/x.py: DESIGN" + ".md",
    ]


# What deploys, operators and the lab run; tests/ holds only tests (issue 24).
PRODUCT = (
    "checks",
    "lab",
    "roles",
    "inventory",
    "group_data",
    "inference_host",
    "deploy.py",
    "validation.py",
    "config.py",
)


def test_nothing_outside_tests_imports_tests():
    found = []
    for top in PRODUCT:
        path = PROJECT_ROOT / top
        for source in [path] if path.is_file() else sorted(path.rglob("*.py")):
            for node in ast.walk(ast.parse(source.read_text(), str(source))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and node.level == 0
                    else []
                )
                found += [
                    f"{source.relative_to(PROJECT_ROOT)}:{node.lineno} imports {n}"
                    for n in names
                    if n == "tests" or n.startswith("tests.")
                ]
    assert found == []
    # and no run-time code is left under tests/ (what is there is a test, its data or its tools)
    left = [
        str(p.relative_to(PROJECT_ROOT))
        for old in ("infra", "standins", "fixtures")
        for p in (PROJECT_ROOT / "tests" / old).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    assert left == []


# What checks/ and lab/ may import of the project, each with why (docs/layout.md says the same).
# checks/ is shipped to a gpu node as a bundle and runs there, or alone against a real host,
# without pyinfra: besides the model it may use only helpers that need nothing but the standard
# library and the model, so one parser or rule serves the deploy and the verdict.
CHECKS_MAY_IMPORT = {
    "checks": "its own modules",
    "roles.site": "the model: the checks expect what the same settings told the deploy",
    "roles.shared.driver_state": "the one parser of nvidia-smi, modinfo and kernel-log output (the driver role's too)",
    "roles.shared.layout": (
        "the paths the deploy writes on the host (the secret-args link, drop-ins, the gateway key)"
    ),
    "roles.shared.nccl": (
        "the NCCL environment the unit gets, for the all-reduce check when the unit's file is unreadable"
    ),
    "roles.shared.replicas": (
        "the replicas' and the gateway's addresses, as roles/serving and roles/gateway derive them"
    ),
    "roles.shared.eagle3": "the drafter/target rule and the speculative flags, the same the inventory check applies",
    "roles.shared.kv_cache": "the deploy's KV-cache estimate, reported beside what the engine allocated",
    "roles.shared.sglang_kv_log": "the parser of SGLang's KV-cache allocation line in the journal",
    "roles.shared.shell": "the one builder of root shell command lines (the gateway's request), as the roles'",
    "roles.shared.tls": "how a client reaches a TLS listener (https URL, curl --cacert/--connect-to), as the roles'",
    "roles.shared.xid_catalog": "NVIDIA's Xid catalog: the Xid check's advice and the Xid alert's severity",
}
# The most specific folder decides: lab/standins/ and lab/fixtures/ have their own lists.
LAB_MAY_IMPORT = {
    "lab": {
        "lab": "its own modules, the stand-ins it serves and the fixtures it builds",
        "roles.site.vault": "the throwaway vault is written and read by the model's own vault code",
        "roles.site.command_line": "`python -m lab`: one-line usage errors, quiet on a closed pipe, like every command",
    },
    "lab.standins": {"lab.standins": "another stand-in (the Hub stand-in listens where the apt stand-in does)"},
    "lab.fixtures": {},
    "inference_host_lab_connector": {"lab": "brings a lab host up as pyinfra connects (docs/lab.md)"},
}
PROJECT_TOPS = ("roles", "checks", "lab", "validation", "deploy", "inventory", "tests", "config", "inference_host")
CONNECTOR = "lab/pyinfra-connector/src"


def project_imports(top: str, project_root: Path = PROJECT_ROOT) -> dict[str, set[str]]:
    """module under top/ -> the project modules it imports (a module, not a name in it)."""
    modules = {
        module_name(p, project_root)
        for folder in ("roles", "checks", "lab")
        for p in (project_root / folder).rglob("*.py")
        if "-" not in str(p.relative_to(project_root))
    }
    found = {}
    for path in sorted((project_root / top).rglob("*.py")):
        relative = str(path.relative_to(project_root))
        module = (
            module_name(path, project_root / CONNECTOR)
            if relative.startswith(CONNECTOR)
            else module_name(path, project_root)
        )
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        targets = set()
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module if node.level == 0 else _relative(module, path, node)
                names = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            targets |= {_resolve(name, modules) or name for name in names if name.split(".")[0] in PROJECT_TOPS}
        found[module] = targets - {module}
    return found


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def outside_the_table(graph: dict[str, set[str]], table: dict[str, dict[str, str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        folder = max((prefix for prefix in table if _within(module, prefix)), key=len)
        found += [
            f"{module} imports {target}, not in {folder}'s list"
            for target in sorted(targets)
            if not any(_within(target, allowed) for allowed in table[folder])
        ]
    return found


def test_checks_import_only_the_model_and_the_helpers_listed():
    graph = project_imports("checks")
    assert "roles.shared.driver_state" in graph["checks.gpu_parsers"]  # the reader sees them
    assert outside_the_table(graph, {"checks": CHECKS_MAY_IMPORT}) == []


def test_the_helpers_checks_use_need_no_pyinfra_and_no_role():
    # They run on the gpu node inside the checks' bundle, where pyinfra is not installed.
    graph = import_graph()
    for name in (n for n in CHECKS_MAY_IMPORT if n.startswith(SHARED)):
        path = PROJECT_ROOT / (name.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not any(n.split(".")[0] == "pyinfra" for n in imported), name
        assert all(layer(t) == "model" or t in CHECKS_MAY_IMPORT for t in graph[name]), (name, graph[name])


def test_lab_imports_only_what_its_table_lists():
    graph = project_imports("lab")
    assert "roles.site.vault" in set().union(*graph.values())  # the reader sees the model's vault
    assert "inference_host_lab_connector" in graph
    assert outside_the_table(graph, LAB_MAY_IMPORT) == []


def test_the_import_tables_catch_an_import_they_do_not_list(tmp_path):
    for path, text in {
        "roles/site/__init__.py": "",
        "roles/shared/__init__.py": "",
        "roles/shared/pve.py": "",
        "roles/serving/__init__.py": "",
        "checks/__init__.py": "from roles.site import load_site\nfrom roles.shared import pve\n",
        "checks/bench.py": "def f():\n    from roles.serving import x\n    from . import textfile\n",
        "checks/textfile.py": "",
        "lab/__init__.py": "from roles.site import vault\n",
        "lab/standins/__init__.py": "",
        "lab/standins/x.py": "import lab\n",
    }.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert outside_the_table(project_imports("checks", tmp_path), {"checks": CHECKS_MAY_IMPORT}) == [
        "checks imports roles.shared.pve, not in checks's list",
        "checks.bench imports roles.serving, not in checks's list",
    ]
    assert outside_the_table(project_imports("lab", tmp_path), LAB_MAY_IMPORT) == [
        "lab imports roles.site, not in lab's list",
        "lab.standins.x imports lab, not in lab.standins's list",
    ]


def test_nothing_imports_the_command():
    # inference_host/ is above everything, like deploy.py: it runs the project's modules; none of
    # them may depend on it (the checks' bundle and the lab run without it).
    found = [
        f"{module} imports {target}"
        for top in ("roles", "checks", "lab")
        for module, targets in project_imports(top).items()
        for target in targets
        if target == "inference_host" or target.startswith("inference_host.")
    ]
    assert found == []


def tool_graph(project_root: Path = PROJECT_ROOT) -> dict[str, set[str]]:
    """checks/ and inference_host/: module -> the modules of the two it imports (any import, in a
    function too). A package's own __init__ and its submodules are not a circle here."""
    sources = {
        module_name(p, project_root): p
        for folder in ("checks", "inference_host")
        for p in (project_root / folder).glob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for module, path in sources.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            else:
                continue
            targets |= {name for name in names if name in sources}
        package = module.split(".")[0]
        graph[module] = {t for t in targets if t != module and package not in (t, module)}
    return graph


def test_the_checks_and_the_operator_command_import_in_no_circle():
    graph = tool_graph()
    assert "checks.acceptance" in graph and "inference_host.teardown" in graph
    assert cycles(graph) == []


def test_the_circle_finder_sees_a_planted_circle():
    graph = tool_graph()
    graph["checks.timespan"] = graph["checks.timespan"] | {"checks.acceptance"}
    assert any("checks.timespan" in c and "checks.acceptance" in c for c in cycles(graph))


def shadowed_submodules(project_root: Path = PROJECT_ROOT) -> list[str]:
    """Names a package's __init__.py binds (an import, a def, an assignment) that are also the
    names of its own submodules or subpackages, bound to something else. Python sets an imported
    submodule as an attribute of its package, that is, as a global of __init__.py: whichever
    import runs last wins, so the package's code meets one or the other by import order (a test
    importing roles/eagle3_training/files/ made the role's `files.directory` the folder's)."""
    found = []
    for init in sorted(project_root.glob("*/**/__init__.py")):
        if ".venv" in init.parts or "tests" in init.parts[len(project_root.parts) :][:1]:
            continue
        folder = init.parent
        subs = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"} | {
            p.parent.name for p in folder.glob("*/__init__.py")
        }
        package = module_name(init, project_root)
        for node in ast.parse(init.read_text(), str(init)).body:
            bound: list[tuple[str, bool]] = []  # (name, is it the submodule itself)
            if isinstance(node, ast.ImportFrom):
                same = node.module == package and node.level == 0
                bound = [(alias.asname or alias.name, same and not alias.asname) for alias in node.names]
            elif isinstance(node, ast.Import):
                bound = [((alias.asname or alias.name).split(".")[0], False) for alias in node.names]
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                bound = [(node.name, False)]
            elif isinstance(node, ast.Assign):
                bound = [(t.id, False) for t in node.targets if isinstance(t, ast.Name)]
            found += [
                f"{init.relative_to(project_root)}:{node.lineno}: `{name}` is also its submodule {package}.{name}"
                for name, itself in bound
                if name in subs and not itself
            ]
    return found


def test_no_package_binds_the_name_of_its_own_submodule():
    assert shadowed_submodules() == []


def test_the_shadow_finder_sees_a_planted_binding(tmp_path):
    name = "planted"  # a role made in tmp_path only
    role = tmp_path / "roles" / name
    (role / "files").mkdir(parents=True)
    (tmp_path / "roles" / "__init__.py").write_text("")
    (role / "files" / "__init__.py").write_text("")
    (role / "privileges.py").write_text("")
    (role / "__init__.py").write_text(
        f"from pyinfra.operations import files, server\nfrom roles.{name} import privileges\n"
    )
    assert shadowed_submodules(tmp_path) == [
        f"roles/{name}/__init__.py:1: `files` is also its submodule roles.{name}.files"
    ]
