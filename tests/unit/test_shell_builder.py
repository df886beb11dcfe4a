"""Every command line the roles hand to a shell is built by roles/shared/shell.py.

Read from the source with ast. A *sink* is where a string becomes shell: `server.shell`'s
commands, a fact's `command()`, pyinfra's `Command` fact, `run_shell_command`, `StringCommand`,
what an `@operation` yields. What reaches a sink must be *built*: a literal (no value in it), a call of `sh`, `argv`
or `chain`, a call of a function declared `-> Shell` (whose own returns are then held to the same
rule), a parameter typed `Shell`, or a variable, list, comprehension, conditional or join made
only of those. An f-string, `%`, `.format` or `+` that puts a value into a command is not built,
and the test names its file and line. The builder's own checks (a literal template, no `Shell()`
made elsewhere) are held here too; the behaviour of the built commands is in
test_shell_read_back.py.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from roles.shared.shell import Shell, argv, chain, sh
from tests.unit.conftest import PROJECT_ROOT

BUILDERS = {"sh", "argv", "chain", "word", "from_pyinfra"}
# Names that turn a string into shell, however they are reached (an alias, getattr).
SINK_NAMES = {"shell", "run_shell_command", "system", "popen", "getoutput", "getstatusoutput"}
# pyinfra commands that carry no shell text (an upload, a Python callable, a download).
NOT_SHELL = {"FileUploadCommand", "FunctionCommand", "FileDownloadCommand"}
SCANNED = [PROJECT_ROOT / "deploy.py", PROJECT_ROOT / "config.py"]


# Code that sends commands to a host's shell without pyinfra: the day-two commands (testinfra's
# host.run) and the checks (host.run, bounded.run(host, ...)), but for what is not moved onto the
# builder yet, each with why.
NOT_YET = {
    "checks/bounded.py": "the wrapper every command goes through (timeout, sh -c), not a command of its own",
}


def remote_sources(root: Path = PROJECT_ROOT) -> list[Path]:
    checks = [p for p in sorted((root / "checks").glob("*.py")) if str(p.relative_to(root)) not in NOT_YET]
    operators = sorted((root / "inference_host").glob("*.py"))
    return [*operators, *checks]


def role_sources(root: Path = PROJECT_ROOT) -> list[Path]:
    """The deploy's Python: roles/ without the model (no commands) and the scripts it ships."""
    paths = [p for p in (root / "roles").rglob("*.py") if "site" not in p.relative_to(root / "roles").parts[:1]]
    return sorted(p for p in paths if "files" not in p.parts) + [p for p in SCANNED if p.exists()]


def _annotated_shell(node: ast.AST | None) -> bool:
    return node is not None and "Shell" in ast.unparse(node)


def _literal_template(node: ast.AST) -> bool:
    """A literal, or a choice between literals (`"a" if x else "b"`)."""
    if isinstance(node, ast.IfExp):
        return _literal_template(node.body) and _literal_template(node.orelse)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _tuple_shape(scope: ast.AST | None) -> list[bool] | None:
    """For a function declared to return tuples (`tuple[list[Shell], str | None]`, or pairs
    `list[tuple[str, list[Shell]]]`): which items of such a tuple are commands. The others (an
    operation's name, a message) are not shell."""
    returns = getattr(scope, "returns", None)
    for node in ast.walk(returns) if returns is not None else ():
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "tuple" and isinstance(node.slice, ast.Tuple):
            return [_annotated_shell(item) for item in node.slice.elts]
    return None


@dataclass
class Module:
    path: Path
    tree: ast.Module
    defs: dict[str, ast.FunctionDef] = field(default_factory=dict)
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module, name)
    aliases: dict[str, str] = field(default_factory=dict)  # `import a.b as c`: c -> a.b
    constants: set[str] = field(default_factory=set)  # module names bound only to literals


def _load(path: Path) -> Module:
    tree = ast.parse(path.read_text(), str(path))
    module = Module(path, tree)
    assigned: dict[str, list[ast.AST]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            module.defs[node.name] = node
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                module.imports[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                module.aliases[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, []).append(node.value)
    for name, values in assigned.items():
        if all(_literal(v) for v in values):
            module.constants.add(name)
    return module


def _literal(node: ast.AST) -> bool:
    """A value fixed in the source: no setting can be in it."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_literal(e) for e in node.elts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal(node.left) and _literal(node.right)
    return False


class Checker:
    def __init__(self, paths: list[Path], remote: bool = False):
        self.remote = remote  # a host's .run(command) is a sink too (testinfra, checks/bounded.py)
        self.modules = {p: _load(p) for p in paths}
        self.by_name = {self._dotted(p): m for p, m in self.modules.items()}
        self.problems: list[str] = []

    @staticmethod
    def _dotted(path: Path) -> str:
        parts = list(path.relative_to(PROJECT_ROOT).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def _function(self, module: Module, name: str) -> ast.FunctionDef | None:
        if name in module.defs:
            return module.defs[name]
        if name in module.imports:
            source, original = module.imports[name]
            target = self.by_name.get(source)
            if target is not None:
                return self._function(target, original)
        return None

    def report(self, module: Module, node: ast.AST, why: str) -> None:
        where = f"{module.path.relative_to(PROJECT_ROOT)}:{getattr(node, 'lineno', '?')}"
        self.problems.append(f"{where}: {why}: {ast.unparse(node)[:120]}")

    # -- what counts as built ------------------------------------------------------------------

    def built(self, node: ast.AST | None, module: Module, scope: ast.AST | None, seen=frozenset()) -> bool:
        if node is None or _literal(node):
            return True
        if isinstance(node, ast.Call):
            return self._built_call(node, module, scope, seen)
        if isinstance(node, ast.Name):
            return self._built_name(node, module, scope, seen)
        shape = _tuple_shape(scope) if isinstance(node, ast.Tuple) else None
        if shape is not None and len(shape) == len(node.elts):
            pairs = zip(node.elts, shape, strict=True)
            return all(self.built(e, module, scope, seen) for e, command in pairs if command)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return all(self.built(e, module, scope, seen) for e in node.elts)
        if isinstance(node, ast.Starred):
            return self.built(node.value, module, scope, seen)
        if isinstance(node, ast.IfExp):
            return self.built(node.body, module, scope, seen) and self.built(node.orelse, module, scope, seen)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.built(node.left, module, scope, seen) and self.built(node.right, module, scope, seen)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            targets = {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
            if isinstance(node.elt, ast.Name) and node.elt.id in targets:
                return all(self.built(g.iter, module, scope, seen) for g in node.generators)
            return self.built(node.elt, module, scope, seen)
        if isinstance(node, ast.JoinedStr):  # only pieces already built, no value
            return all(
                isinstance(v, ast.Constant) or (v.format_spec is None and self.built(v.value, module, scope, seen))
                for v in node.values
            )
        return False

    def _built_call(self, node: ast.Call, module: Module, scope, seen) -> bool:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in BUILDERS:
            return True
        if name == "StringCommand":  # pyinfra's command made of pieces: built when they are
            return all(self.built(a, module, scope, seen) for a in node.args)
        if isinstance(func, ast.Attribute) and func.attr == "join" and isinstance(func.value, ast.Constant):
            return all(self.built(a, module, scope, seen) for a in node.args)
        if isinstance(func, ast.Name) and func.id in ("list", "tuple", "str"):
            return all(self.built(a, module, scope, seen) for a in node.args)
        if isinstance(func, ast.Attribute) and func.attr == "command" and self._role_fact(func.value, module, scope):
            return True  # a role's fact: its command() is held by the roles' test above
        if isinstance(func, ast.Name):
            target = self._function(module, func.id)
            return target is not None and _annotated_shell(target.returns)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            # a module's function (`legacy_account.plan(...)`) or a method of this module's class
            owner = module.imports.get(func.value.id)
            target = None
            if owner is not None:
                other = self.by_name.get(f"{owner[0]}.{owner[1]}")
                target = other.defs.get(func.attr) if other else None
            elif func.value.id in ("self", "cls"):
                target = next(
                    (
                        f
                        for f in ast.walk(module.tree)
                        if isinstance(f, ast.FunctionDef) and f.name == func.attr and _annotated_shell(f.returns)
                    ),
                    None,
                )
            return target is not None and _annotated_shell(target.returns)
        return False

    @staticmethod
    def _role_fact(node: ast.AST, module: Module, scope) -> bool:
        """A variable made only by calling classes imported from roles/ (the roles' facts)."""
        if not isinstance(node, ast.Name) or scope is None:
            return False
        values = [
            inner.value
            for inner in ast.walk(scope)
            if isinstance(inner, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in inner.targets)
        ]
        calls = [c for v in values for c in ([v.body, v.orelse] if isinstance(v, ast.IfExp) else [v])]
        imported = {
            alias.asname or alias.name
            for inner in ast.walk(scope)
            if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("roles.")
            for alias in inner.names
        } | {name for name, (source, _) in module.imports.items() if source.startswith("roles.")}
        return bool(calls) and all(
            isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in imported for c in calls
        )

    def _built_name(self, node: ast.Name, module: Module, scope, seen) -> bool:
        if node.id in module.constants:
            return True
        if scope is None or (node.id, id(scope)) in seen:
            return scope is not None
        seen = seen | {(node.id, id(scope))}
        args = scope.args.args + scope.args.kwonlyargs + scope.args.posonlyargs
        for arg in args:
            if arg.arg == node.id:
                return _annotated_shell(arg.annotation)
        values: list[ast.AST] = []
        for inner in ast.walk(scope):
            if isinstance(inner, ast.Assign):
                for target in inner.targets:
                    for n in ast.walk(target):
                        if isinstance(n, ast.Name) and n.id == node.id:
                            values.append(inner.value)
            elif isinstance(inner, (ast.AnnAssign, ast.AugAssign)) and isinstance(inner.target, ast.Name):
                if inner.target.id == node.id and inner.value is not None:
                    values.append(inner.value)
            elif isinstance(inner, (ast.For, ast.comprehension)):
                if any(isinstance(n, ast.Name) and n.id == node.id for n in ast.walk(inner.target)):
                    values.append(inner.iter)
            elif isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute):
                # list.append(x) / list.extend(xs) into the variable
                owner = inner.func.value
                if isinstance(owner, ast.Name) and owner.id == node.id and inner.func.attr in ("append", "extend"):
                    values.extend(inner.args)
        return bool(values) and all(self.built(v, module, scope, seen) for v in values)

    # -- the sinks -----------------------------------------------------------------------------

    def check(self) -> list[str]:
        for module in self.modules.values():
            self._check_module(module)
        return list(dict.fromkeys(self.problems))  # a nested function is walked with its parent

    def _check_module(self, module: Module) -> None:
        for scope in ast.walk(module.tree):
            if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            decorators = {ast.unparse(d).split("(")[0].split(".")[-1] for d in scope.decorator_list}
            returns = [n for n in ast.walk(scope) if isinstance(n, ast.Return) and n.value is not None]
            fact_command = scope.name == "command" and [a.arg for a in scope.args.args[:1]] == ["self"]
            if (fact_command or _annotated_shell(scope.returns)) and module.path.name != "shell.py":
                for ret in returns:
                    if not self.built(ret.value, module, scope):
                        self.report(module, ret, f"{scope.name}() returns a command not built by sh()")
            if "operation" in decorators:
                for node in ast.walk(scope):
                    if isinstance(node, ast.Yield) and not self._not_shell(node.value):
                        if not self.built(node.value, module, scope):
                            self.report(module, node, "an operation yields a command not built by sh()")
            for node in ast.walk(scope):
                if isinstance(node, ast.Call):
                    self._check_call(node, module, scope)
        for node in module.tree.body:  # module-level calls too
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Call):
                        self._check_call(inner, module, None)

    @staticmethod
    def _not_shell(node: ast.AST | None) -> bool:
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            return name in NOT_SHELL
        return False

    @staticmethod
    def _canonical(func: ast.AST, module: Module) -> str:
        """The dotted name a call reaches through the module's imports: `run` of `from
        pyinfra.operations.server import shell as run` is pyinfra.operations.server.shell."""
        text = ast.unparse(func)
        head, _, rest = text.partition(".")
        if head in module.imports:
            source, name = module.imports[head]
            head = f"{source}.{name}"
        elif head in module.aliases:
            head = module.aliases[head]
        return f"{head}.{rest}" if rest else head

    def _check_call(self, node: ast.Call, module: Module, scope) -> None:
        func = ast.unparse(node.func)
        canonical = self._canonical(node.func, module)
        last = canonical.split(".")[-1]
        shell_args: list[ast.AST] = []
        if func == "getattr" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
            if node.args[1].value in SINK_NAMES:
                self.report(module, node, "a shell sink reached through getattr()")
        elif canonical in ("os.system", "os.popen"):
            shell_args = node.args[:1] + [k.value for k in node.keywords if k.arg in ("command", "cmd")]
        elif func in ("server.shell", "shell") or canonical.endswith("server.shell"):
            shell_args = node.args[:1] + [k.value for k in node.keywords if k.arg == "commands"]
        elif last == "run_shell_command":
            shell_args = node.args[:1] + [k.value for k in node.keywords if k.arg == "command"]
        elif last == "get_fact" and node.args and ast.unparse(node.args[0]).split(".")[-1] == "Command":
            shell_args = node.args[1:2] + [k.value for k in node.keywords if k.arg == "command"]  # pyinfra's fact
        elif last == "StringCommand":
            shell_args = list(node.args)
        elif (
            self.remote and last == "run" and not func.startswith(("subprocess.", "args.")) and func not in module.defs
        ):
            # (`args.run` is the operator command's own subcommand function, chosen by argparse)
            # bounded.run(host, command, ...) / host.run(command) / get_host(...).run(command)
            shell_args = node.args[1:2] if func == "bounded.run" else node.args[:1]
        elif last in ("run", "Popen", "check_output", "check_call", "call", "getoutput", "getstatusoutput"):
            if any(
                k.arg == "shell" and not (isinstance(k.value, ast.Constant) and not k.value.value)
                for k in node.keywords
            ):
                self.report(module, node, "a subprocess through a shell")
        elif last == "from_pyinfra" and module.path.name not in ("shell.py", "fact_batch.py"):
            self.report(module, node, "from_pyinfra() outside the fact batch (it takes any text as built)")
        elif last == "Shell" and module.path.name != "shell.py":
            self.report(module, node, "Shell() made outside roles/shared/shell.py")
        elif last == "sh" and (not node.args or not _literal_template(node.args[0])):
            self.report(module, node, "sh() with a template that is not a literal")
        for arg in shell_args:
            if not self.built(arg, module, scope):
                self.report(module, arg, f"{last}() gets a command not built by sh()")


def test_every_command_the_roles_run_is_built_by_the_builder():
    problems = Checker(role_sources()).check()
    assert not problems, "command lines formatted outside roles/shared/shell.py:\n" + "\n".join(problems)


def test_every_command_the_day_two_tools_run_is_built_by_the_builder():
    assert len(remote_sources()) > 10  # the checks are read at all
    problems = Checker(remote_sources(), remote=True).check()
    assert not problems, "command lines formatted outside roles/shared/shell.py:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "planted",
    [
        'testinfra.get_host(url).run("sh -c " + shlex.quote(script))',
        'bounded.run(host, f"systemctl show -p EnvironmentFiles {unit}", what="systemctl")',
        'host.run(f"cat {path}")',
    ],
)
def test_a_planted_remote_command_is_found(planted):
    path = PROJECT_ROOT / "inference_host" / "zz_planted_for_test.py"
    source = f"import shlex\n\n\ndef f(testinfra, bounded, host, url, script, unit, path):\n    {planted}\n"
    try:
        path.write_text(source)
        problems = Checker([path], remote=True).check()
    finally:
        path.unlink()
    assert len(problems) == 1 and "run() gets a command not built by sh()" in problems[0], problems


PLANTED = """
from pyinfra.operations import server
from roles.shared.shell import Shell, from_pyinfra, sh


def _prefix_command(prefix) -> Shell:
    return sh("rm -rf -- {prefix}", prefix=prefix)


def role(prefix, version):
    server.shell(name="fine", commands=[_prefix_command(prefix), sh("echo {v}", v=version)])
    server.shell(name="planted", commands=[f"rm -rf {prefix}"])
"""


@pytest.mark.parametrize(
    "planted",
    [
        'server.shell(name="planted", commands=[f"rm -rf {prefix}"])',
        'server.shell(name="planted", commands=["rm -rf %s" % prefix])',
        'server.shell(name="planted", commands=["rm -rf {}".format(prefix)])',
        'server.shell(name="planted", commands=["rm -rf " + prefix])',
        'command = f"rm -rf {prefix}"\n    server.shell(name="planted", commands=[command])',
        'server.shell(name="planted", commands=[sh(f"rm -rf {prefix}")])',
        'server.shell(name="planted", commands=[Shell(prefix)])',
        'server.shell(name="planted", commands=[from_pyinfra(f"rm -rf {prefix}")])',
    ],
)
def test_a_planted_formatted_command_is_found(tmp_path, planted):
    role = PROJECT_ROOT / "roles" / "zz_planted_for_test.py"
    source = PLANTED.replace('server.shell(name="planted", commands=[f"rm -rf {prefix}"])', planted)
    try:
        role.write_text(source)
        problems = Checker([role]).check()
    finally:
        role.unlink()
    assert problems and all("zz_planted_for_test.py:1" in p for p in problems), problems


def test_a_fact_command_formatted_from_a_value_is_found():
    role = PROJECT_ROOT / "roles" / "zz_planted_fact.py"
    try:
        role.write_text(
            "from pyinfra.api import FactBase\n\n\nclass Found(FactBase):\n"
            "    def command(self, path):\n        return f'cat {path}'\n"
        )
        problems = Checker([role]).check()
    finally:
        role.unlink()
    assert len(problems) == 1 and "command() returns" in problems[0], problems


# -- the builder's own refusals -------------------------------------------------------------------


def test_values_are_single_words_and_globs_stay_globs():
    assert sh("rm -rf -- {p}", p="/opt/uv tools") == "rm -rf -- '/opt/uv tools'"
    assert sh("echo {t}/lib/python3*/site", t="/a b") == "echo '/a b'/lib/python3*/site"
    assert sh("apt-get install -y {pkgs}", pkgs=["git", "jq"]) == "apt-get install -y git jq"
    assert isinstance(argv("qm", "set", 100, "--net0", "a b"), Shell)
    assert chain(sh("true"), sh("false"), operator="||") == "true || false"


@pytest.mark.parametrize(
    "template, values, refused",
    [
        ("apt-get install -y {pkgs}", {"pkgs": ["-oDpkg::Pre-Invoke::=touch /tmp/x"]}, "read as an option"),
        ("rm -rf -- {a} && mkdir {b}", {"a": "x", "b": "-p"}, "read as an option"),
        ('echo "{x}"', {"x": "a"}, "inside"),
        ("echo '{x}'", {"x": "a"}, "inside"),
        ("echo {x}", {"x": "a\0b"}, "NUL"),
        ("echo {x}", {"x": True}, "not a str"),
        ("echo {x}", {"x": None}, "not a str"),
        ("echo {x!r}", {"x": "a"}, "plainly"),
        ("echo {x}", {}, "no value"),
        ("echo {x}", {"x": "a", "y": "b"}, "not in"),
        ("echo pre{x}", {"x": ["a", "b"]}, "whole words"),
        ("cat > /f <<EOF\n{x}\nEOF", {"x": "$(id)"}, "here-document"),
        ("cat > /f <<-'EOF'\n\tline {x}\n\tEOF", {"x": "a"}, "here-document"),
        ('cat <<"END"\n{x}', {"x": "a"}, "here-document"),
    ],
)
def test_the_builder_refuses_what_would_be_misread(template, values, refused):
    with pytest.raises((ValueError, TypeError, KeyError), match=refused):
        sh(template, **values)


def test_an_option_value_after_double_dash_or_attached_is_one_word():
    assert sh("rm -rf -- {p}", p="-x") == "rm -rf -- -x"
    assert sh("pip install --index-url={u}", u="-u") == "pip install --index-url=-u"
    with pytest.raises(TypeError):
        chain(sh("true"), "rm -rf /")  # a plain str is not a built command


def test_an_unquoted_here_document_would_have_run_the_quoted_value(tmp_path):
    """Why the builder refuses a field in a here-document's body: quoting does nothing there. The
    same value, quoted by hand as the builder would, runs as a command in sh's own reading."""
    import shlex
    import subprocess

    marker = tmp_path / "ran"
    script = f"cat <<EOF\n{shlex.quote(f'$(touch {marker})')}\nEOF\n"
    subprocess.run(["sh", "-c", script], check=True, capture_output=True)
    assert marker.exists()
    with pytest.raises(ValueError, match="here-document"):
        sh("cat <<EOF\n{v}\nEOF", v=f"$(touch {marker})")
    # after the delimiter's line the template is shell words again, and fields are quoted as ever
    assert sh("cat <<EOF\nfixed\nEOF\necho {v}", v="$(x)") == "cat <<EOF\nfixed\nEOF\necho '$(x)'"


# -- the ways around a sink: aliases, getattr, os.system --------------------------------------------

BYPASSES = [
    "from pyinfra.operations.server import shell as run\ndef r(p):\n    run(name='x', commands=[f'rm -rf {p}'])\n",
    "from pyinfra.operations import server as srv\ndef r(p):\n    srv.shell(name='x', commands=[f'rm -rf {p}'])\n",
    "import pyinfra.operations.server as srv\ndef r(p):\n    srv.shell(name='x', commands=['rm -rf ' + p])\n",
    "from pyinfra.operations import server\ndef r(p):\n    getattr(server, 'shell')(name='x', commands=['ls'])\n",
    "import os\ndef r(p):\n    os.system(f'rm -rf {p}')\n",
    "from os import system as go\ndef r(p):\n    go('rm -rf ' + p)\n",
    "import subprocess as sp\ndef r(p):\n    sp.run('rm -rf ' + p, shell=True)\n",
]


@pytest.mark.parametrize("source", BYPASSES, ids=range(len(BYPASSES)))
def test_a_sink_reached_another_way_is_found(source):
    role = PROJECT_ROOT / "roles" / "zz_planted_bypass.py"
    try:
        role.write_text(source)
        problems = Checker([role]).check()
    finally:
        role.unlink()
    assert problems and all("zz_planted_bypass.py:" in p for p in problems), problems


def test_a_formatted_pct_destroy_in_the_operator_command_is_found():
    """inference_host/ is read whole: the teardown sends its commands to the node through testinfra."""
    assert PROJECT_ROOT / "inference_host" / "teardown.py" in remote_sources()
    planted = PROJECT_ROOT / "inference_host" / "zz_planted_teardown.py"
    try:
        planted.write_text(
            "def destroy(testinfra, url, vmid):\n    testinfra.get_host(url).run(f'pct destroy {vmid}')\n"
        )
        problems = Checker([planted], remote=True).check()
    finally:
        planted.unlink()
    assert len(problems) == 1 and "run() gets a command not built by sh()" in problems[0], problems


def lab_sources(root: Path = PROJECT_ROOT) -> list[Path]:
    """The lab's run-time Python (what builds and drives the lab), its stand-ins included."""
    return sorted(p for p in (root / "lab").rglob("*.py") if "__pycache__" not in p.parts)


def test_the_lab_sends_nothing_through_a_shell_by_accident():
    """The lab formats its own container scripts (it owns every value there), but no value of its
    reaches a shell through os.system, os.popen or subprocess's shell=True."""
    assert len(lab_sources()) > 20
    problems = [p for p in Checker(lab_sources()).check() if "through a shell" in p or "os." in p or "system" in p]
    assert not problems, "\n".join(problems)


# -- shell-script templates: a render-time guard like the unit files' ---------------------------


def test_every_shell_script_template_is_guarded():
    from roles.shared import templates

    scripts = sorted(
        str(p.relative_to(PROJECT_ROOT))
        for p in (PROJECT_ROOT / "roles").rglob("*.j2")
        if p.name.endswith(".sh.j2") or p.read_text().startswith(("#!/bin/sh", "#!/bin/bash"))
    )
    assert "roles/serving/templates/launch.j2" in scripts and len(scripts) >= 7
    assert all("finalize" in templates.jinja_env_kwargs(s) for s in scripts), scripts


@pytest.mark.parametrize(
    "values, refused",
    [
        ({"stack_id": "s\nrm -rf /", "engine_label": "SGLang", "command": "x"}, "comment"),
        ({"stack_id": "s", "engine_label": "SGLang", "command": "python -m x $(id)"}, "not shell text"),
    ],
)
def test_a_plain_value_in_a_shell_script_stops_the_render(values, refused):
    """launch.j2 as the serving role renders it, with one value not built by roles/shared/shell.py."""
    from roles.shared import templates
    from roles.shared.shell import comment

    def build(name, value):
        if name == "command":
            return value  # a plain str: live shell text
        return comment(value)

    with pytest.raises(ValueError, match=refused):
        templates.render("roles/serving/templates/launch.j2", **{k: build(k, v) for k, v in values.items()})


def test_a_built_launcher_renders():
    from roles.shared import templates
    from roles.shared.shell import comment

    text = templates.render(
        "roles/serving/templates/launch.j2",
        stack_id=comment("s-1"),
        engine_label=comment("SGLang 0.5.9"),
        command=argv("/opt/e nv/bin/python", "-m", "sglang.launch_server"),
    )
    assert text.endswith("exec '/opt/e nv/bin/python' -m sglang.launch_server\n")
