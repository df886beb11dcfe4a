"""The settings reference (docs/settings.md), generated from the sections and the roles' source.

Each key's meaning is its pydantic ``Field(description=...)``, its type and default come from
the same field, and "read by" is found by reading the project's own source (``ast``, nothing is
imported or executed): an attribute ``<x>.<section>.<field>`` or ``<alias>.<field>`` where the
alias was bound from ``<x>.<section>``, is named like the section or is annotated with its class.
A role that imports a shared helper (roles/shared) reads what the helper reads. The reference is
committed; tests/unit/test_settings_reference.py fails when it is stale or a key has no meaning.

    uv run python -m roles.site --settings > docs/settings.md
"""

from __future__ import annotations

import ast
import re
import textwrap
import typing
from functools import cache
from pathlib import Path

from roles.site.fields import _RULE_TEXT, PROJECT_ROOT, Section, type_text
from roles.site.old_keys import REMOVED_KEYS, RENAMED_KEYS
from roles.site.schema import SECTIONS, SITE_KEYS, HostSettings
from roles.site.sections.serving import SpeculativeSettings

REFERENCE = PROJECT_ROOT / "docs" / "settings.md"
_WIDTH = 100


def _section_attrs() -> dict[str, type[Section]]:
    by_name = {cls.__name__: cls for cls in SECTIONS}
    attrs = {}
    for name, field in HostSettings.__dataclass_fields__.items():  # type: ignore[attr-defined]  # _with_sections
        type_name = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
        if type_name in by_name:
            attrs[name] = by_name[type_name]
    # Other holders of a section, e.g. roles/site/weights.py's `settings: WeightsSettings`.
    for path in (PROJECT_ROOT / "roles").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and ast.unparse(node.annotation) in by_name
                and node.target.id not in attrs
            ):
                attrs[node.target.id] = by_name[ast.unparse(node.annotation)]
    return attrs


def _reader_files() -> dict[str, list[Path]]:
    """Who reads settings: each role package, each shared helper, the checks, the validation."""
    roles = PROJECT_ROOT / "roles"
    readers: dict[str, list[Path]] = {}
    for package in sorted(p for p in roles.iterdir() if (p / "__init__.py").exists()):
        if package.name in ("site", "shared"):
            continue
        readers[package.name] = sorted(package.rglob("*.py"))
    for helper in sorted((roles / "shared").glob("*.py")):
        if helper.name != "__init__.py":
            readers[f"shared/{helper.stem}"] = [helper]
    # deploy.py runs the table of roles (roles/composition.py), whose conditions read settings.
    readers["deploy.py"] = [PROJECT_ROOT / "deploy.py", roles / "composition.py"]
    readers["checks"] = sorted((PROJECT_ROOT / "checks").rglob("*.py"))
    readers["site rules"] = sorted(
        p for p in (roles / "site").glob("*.py") if p.name not in ("schema.py", "table.py", "__init__.py")
    )
    return readers


@cache
def _property_reads() -> dict[str, frozenset[str]]:
    """Keys each HostSettings property reads (host.speculative is serving_speculative)."""
    tree = ast.parse((PROJECT_ROOT / "roles" / "site" / "schema.py").read_text())
    host_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "HostSettings")
    found = {}
    for node in host_class.body:
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list
        ):
            reads = _Reads(_section_attrs(), properties={})
            reads.visit(node)
            if reads.keys:
                found[node.name] = frozenset(reads.keys)
    return found


@cache
def _method_reads() -> dict[str, dict[str, frozenset[str]]]:
    """Section class name -> its method (or property) -> the keys it reads through self, those of
    the methods it calls included: monitoring.receivers_for() reads critical_receivers."""
    found: dict[str, dict[str, frozenset[str]]] = {}
    for path in sorted((PROJECT_ROOT / "roles" / "site" / "sections").glob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if not isinstance(node, ast.ClassDef):
                continue
            cls = next((c for c in SECTIONS if c.__name__ == node.name), None)
            if cls is None:
                continue
            fields, calls = {}, {}
            for method in (n for n in node.body if isinstance(n, ast.FunctionDef)):
                used = {
                    a.attr
                    for a in ast.walk(method)
                    if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id == "self"
                }
                fields[method.name] = {cls.PREFIX + f for f in used if f in cls.model_fields}
                calls[method.name] = used
            for name in fields:
                seen, todo = {name}, list(calls[name])
                while todo:  # the methods it calls, and theirs
                    other = todo.pop()
                    if other in fields and other not in seen:
                        seen.add(other)
                        todo.extend(calls[other])
                fields[name] = set().union(*(fields[m] for m in seen))
            found[cls.__name__] = {name: frozenset(keys) for name, keys in fields.items() if keys}
    return found


class _Reads(ast.NodeVisitor):
    """Keys read in one module: <x>.<section>.<field>, <alias>.<field>, a section's method that
    reads fields (<alias>.receivers_for(...)), and pyinfra's own data read by name
    (data.get("ssh_user"), data["ssh_key"])."""

    def __init__(self, attrs: dict[str, type[Section]], properties: dict[str, frozenset[str]] | None = None):
        self.attrs = attrs
        self.properties = _property_reads() if properties is None else properties
        self.by_class = {cls.__name__: cls for cls in attrs.values()}
        self.all_keys = {cls.PREFIX + name for cls in SECTIONS for name in cls.model_fields}
        self.keys: set[str] = set()
        self.template_names: dict[str, set[type[Section]]] = {}  # render(..., nccl=settings.nccl)
        self.scopes: list[dict[str, set[type[Section]]]] = [{}]

    def _section_of(self, node: ast.AST) -> set[type[Section]]:
        if isinstance(node, ast.Attribute) and node.attr in self.attrs:
            return {self.attrs[node.attr]}
        if isinstance(node, ast.Name):
            found = set().union(*(scope.get(node.id, set()) for scope in self.scopes))
            if node.id in self.attrs:
                found.add(self.attrs[node.id])
            return found
        return set()

    def _bind(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            for one_target, one_value in zip(target.elts, value.elts, strict=False):
                self._bind(one_target, one_value)
        elif isinstance(target, ast.Name) and self._section_of(value):
            self.scopes[-1].setdefault(target.id, set()).update(self._section_of(value))

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        scope: dict[str, set[type[Section]]] = {}
        for arg in node.args.args + node.args.kwonlyargs:
            annotation = ast.unparse(arg.annotation) if arg.annotation else ""
            for class_name, cls in self.by_class.items():
                if class_name in annotation:
                    scope.setdefault(arg.arg, set()).add(cls)
        self.scopes.append(scope)
        # Bindings first, so a use before the assignment's line in a loop still counts.
        for child in ast.walk(node):
            if isinstance(child, ast.Assign):
                for target in child.targets:
                    self._bind(target, child.value)
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(self.scopes) == 1:
            for target in node.targets:
                self._bind(target, node.value)
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg and self._section_of(node.value):
            self.template_names.setdefault(node.arg, set()).update(self._section_of(node.value))
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in self.properties and not self._section_of(node.value):
            self.keys |= self.properties[node.attr]
        for cls in self._section_of(node.value):
            if node.attr in cls.model_fields:
                self.keys.add(cls.PREFIX + node.attr)
            self.keys |= _method_reads().get(cls.__name__, {}).get(node.attr, frozenset())
        self.generic_visit(node)

    def _named(self, node: ast.AST) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in self.all_keys:
            self.keys.add(node.value)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
            self._named(node.args[0])
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self._named(node.slice)
        self.generic_visit(node)


def _keys_read(paths: list[Path], attrs: dict[str, type[Section]]) -> set[str]:
    """Keys the Python files read, and their templates through the names a section is passed as."""
    keys: set[str] = set()
    names: dict[str, set[type[Section]]] = {}
    for path in paths:
        reads = _Reads(attrs)
        reads.visit(ast.parse(path.read_text(), str(path)))
        keys |= reads.keys
        for name, classes in reads.template_names.items():
            names.setdefault(name, set()).update(classes)
    templates = {t for p in paths for t in p.parent.glob("templates/*.j2")}
    for template in sorted(templates):
        text = template.read_text()
        for name, classes in names.items():
            for field in re.findall(rf"\b{re.escape(name)}\.(\w+)", text):
                keys.update(cls.PREFIX + field for cls in classes if field in cls.model_fields)
    return keys


def _shared_imports(path: Path) -> set[str]:
    """roles.shared modules one file imports: roles.shared.x, from roles.shared import x."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("roles.shared."):
                found.add(node.module.split(".")[2])
            elif node.module == "roles.shared":
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("roles.shared."))
    return found


@cache
def readers_of_keys() -> dict[str, tuple[str, ...]]:
    """Each key -> who reads it (roles by name; shared helpers through the roles importing them)."""
    attrs = _section_attrs()
    files = _reader_files()
    direct = {who: _keys_read(paths, attrs) for who, paths in files.items()}
    imports = {who: set().union(*(_shared_imports(p) for p in paths)) for who, paths in files.items()}
    closed: dict[str, set[str]] = {}
    for who in files:
        seen, todo = set(), list(imports[who])
        while todo:
            helper = todo.pop()
            if helper in seen or f"shared/{helper}" not in files:
                continue
            seen.add(helper)
            todo.extend(imports[f"shared/{helper}"])
        closed[who] = direct[who].union(*(direct[f"shared/{h}"] for h in seen))
    result: dict[str, tuple[str, ...]] = {}
    for cls in SECTIONS:
        for key in (cls.PREFIX + name for name in cls.model_fields):
            # pyinfra's connector reads its own ssh_* data (pyinfra/connectors/ssh.py, 3.10)
            pyinfra = ("pyinfra",) if cls.__name__ == "SshSettings" else ()
            result[key] = pyinfra + tuple(who for who in files if not who.startswith("shared/") and key in closed[who])
    return result


def _valid_text(field) -> str:
    """What the field's rule accepts: the `valid` text of its check(...) (roles/site/fields.py)."""
    validators = list(field.metadata)
    for arg in typing.get_args(field.annotation):
        if typing.get_origin(arg) is typing.Annotated:
            validators += list(arg.__metadata__)
    texts = []
    for validator in validators:
        cells = (
            dict(zip(validator.func.__code__.co_freevars, validator.func.__closure__ or (), strict=False))
            if hasattr(validator, "func")
            else {}
        )
        if "valid" in cells:
            texts.append(str(cells["valid"].cell_contents))
        elif id(validator) in _RULE_TEXT:  # a rule with a reason per value (fields.HostFolder, ...)
            texts.append(_RULE_TEXT[id(validator)])
    return "; ".join(texts)


def _default_text(field) -> str:
    if field.is_required():
        return "(required)"
    return f"`{field.get_default(call_default_factory=True)!r}`"


def _entry(key: str, kind: str, default: str, readers: tuple[str, ...], meaning: str) -> list[str]:
    read_by = ", ".join(readers) if readers else "nothing yet"
    head = f"- **`{key}`** ({kind}, default {default}; read by {read_by}):"
    return textwrap.wrap(
        f"{head} {meaning}", _WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    )


def _speculative_keys() -> list[str]:
    lines = []
    for name, field in SpeculativeSettings.model_fields.items():
        kind = type_text(field.annotation).replace(" | ", " or ")
        text = f"- `{name}` ({kind}, default {_default_text(field)}): {' '.join((field.description or '').split())}"
        lines += textwrap.wrap(
            text, _WIDTH, initial_indent="  ", subsequent_indent="    ", break_long_words=False, break_on_hyphens=False
        )
    return lines


def missing_descriptions() -> list[str]:
    """Keys (and serving_speculative's subkeys) whose Field has no description."""
    fields = [(cls.PREFIX + name, field) for cls in SECTIONS for name, field in cls.model_fields.items()]
    fields += [(f"serving_speculative.{name}", field) for name, field in SpeculativeSettings.model_fields.items()]
    return [key for key, field in fields if not (field.description or "").strip()]


def settings_reference() -> str:
    """The whole of docs/settings.md."""
    readers = readers_of_keys()
    out = [
        "# Settings reference",
        "",
        "<!-- generated by `uv run python -m roles.site --settings > docs/settings.md`; do not edit:",
        "     the meanings are the Field descriptions in roles/site/sections/*.py -->",
        "",
        "Every key a host's data may carry. Keys are flat and prefixed by their section; a key that",
        "is no setting is refused, with the closest valid name. Each section is one pydantic model in",
        "its own module under [roles/site/sections/](../roles/site/sections/) (strict types, unknown",
        "keys refused), named under its heading; a new setting is one field with its",
        "`Field(default, description=...)` there. *Read by* names the",
        "roles (and the health checks, `checks`, and the inventory's cross-host rules, `site rules`)",
        "whose code reads the key, found in their source.",
        "",
    ]
    for cls in SECTIONS:
        title = (cls.__doc__ or "").strip().split("\n\n")[0]
        module = f"roles/site/sections/{cls.__module__.rpartition('.')[2]}.py"
        out += [
            f"## `{cls.PREFIX}*`",
            "",
            *textwrap.wrap(" ".join(title.split()), _WIDTH),
            "",
            f"Defined in [{module}](../{module}).",
            "",
        ]
        for name, field in cls.model_fields.items():
            key = cls.PREFIX + name
            kind = type_text(field.annotation).replace(" | ", " or ")
            meaning = " ".join((field.description or "").split())
            valid = _valid_text(field)
            out += _entry(
                key, kind, _default_text(field), readers[key], f"{meaning} Valid: {valid}." if valid else meaning
            )
            if key == "serving_speculative":
                out += _speculative_keys()
        out.append("")
    out += ["## Site keys", "", "Where the stack and the secrets live (read by the site model).", ""]
    for key, meaning in SITE_KEYS.items():
        out += _entry(key, "str", "none", ("the site model",), meaning)
    out += [
        "",
        "## Renamed keys",
        "",
        "An inventory that still writes one of these is refused in one line naming the key to write",
        "([upgrades.md](upgrades.md#engine-neutral-setting-names)).",
        "",
        *(f"- `{old}`: now `{new}`" for old, new in RENAMED_KEYS.items()),
        "",
        "## Removed keys",
        "",
        "An inventory that still writes one of these is refused in one line saying what replaced it.",
        "",
        *(f"- `{old}`: {why}" for old, why in REMOVED_KEYS.items()),
    ]
    return "\n".join(out) + "\n"


def settings_table() -> str:
    """Kept for callers of the old name: the reference above."""
    return settings_reference()
