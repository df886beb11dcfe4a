"""Reading the project's YAML files (the stack file, the vault): a key written twice is refused,
and a parser error is one line that names the file, the line and the column.

PyYAML's SafeLoader keeps the last of two equal keys without a word (yaml/constructor.py,
SafeConstructor.construct_mapping: a plain dict assignment), so a second `active:` in the stack
file, or a second secret of one name, silently replaced the first.
"""

from __future__ import annotations

import errno
import re
import stat
from pathlib import Path

import yaml

# The project's YAML files are a few kilobytes; a path that names a device (/dev/zero), a pipe
# (open() waits for a writer forever) or a file of gigabytes is refused before it is read, so
# that `inference-host validate` answers in one line instead of hanging or running out of memory.
MAX_BYTES = 4 * 1024 * 1024


def read_text(path: Path) -> str:
    """The text of a regular file of at most MAX_BYTES. Raises FileNotFoundError,
    IsADirectoryError, PermissionError, UnicodeDecodeError, and OSError (strerror says why) for
    anything that is not a regular file or is larger."""
    mode = Path(path).stat().st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder", str(path))
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "not a regular file but a device, a pipe or a socket", str(path))
    with open(path, "rb") as file:
        data = file.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise OSError(errno.EFBIG, f"larger than {MAX_BYTES // 1024 // 1024} MiB", str(path))
    return data.decode("utf-8")


class DuplicateKeyError(yaml.YAMLError):
    """A mapping with one key twice: the key and both lines (1-based)."""

    def __init__(self, key, first_line: int, second_line: int):
        self.key, self.first_line, self.second_line = key, first_line, second_line
        super().__init__(f"key {key!r} is written twice (lines {first_line} and {second_line}); expected each key once")


class AliasError(yaml.YAMLError):
    """An alias (*name): refused, where PyYAML would expand it."""

    def __init__(self, anchor: str, line: int, column: int):
        self.anchor, self.line, self.column = anchor, line, column
        super().__init__(
            f"line {line}, column {column}: an alias (*{anchor}) is not allowed; expected every value written"
            " out (nested aliases expand a file of a few lines into billions of values)"
        )


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with a key written twice, and any alias.

    Aliases: PyYAML's composer (yaml/composer.py compose_node, 6.0) returns the anchored node
    for each alias, so nine nested levels of nine aliases (a "billion laughs" document) are
    a graph of 10**9 paths; anything that walks it (the stack file's rules, repr() in a
    message) ran out of memory after 45 s. No file of the project needs an alias, so the
    first one is refused as the parser meets it, before anything is built."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise AliasError(str(event.anchor), event.start_mark.line + 1, event.start_mark.column + 1)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: the constructor names it below
                    continue
                if first != key_node.start_mark.line + 1:
                    raise DuplicateKeyError(key, first, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep)


# A file named by stack_file or secrets_file may be any file of this machine (/etc/shadow,
# ~/.docker/config.json, which is YAML too): a refusal names the file, a line and what is wrong,
# never the file's text. A top-level key is shown only when it is a plain name of ours
# ([A-Za-z_] then letters, digits, _ . -, 64 at most); any other is named by its line.
PLAIN_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def top_level_lines(text: str, loader: type[yaml.SafeLoader] = UniqueKeyLoader) -> dict[str, int]:
    """The line (1-based) of each top-level key of a YAML mapping, by its text."""
    node = yaml.compose(text, Loader=loader)  # a SafeLoader subclass; its aliases were refused by load()
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(key.value): key.start_mark.line + 1 for key, _ in node.value}


def foreign_keys_problem(text: str, keys, ours, what: str, loader: type[yaml.SafeLoader] = UniqueKeyLoader):
    """Why a file is not `what` (a key that is not a plain name, or no key of ours at all), naming
    a line and never the file's text; or None."""
    lines = top_level_lines(text, loader)
    odd = next((key for key in keys if not (isinstance(key, str) and PLAIN_NAME_RE.fullmatch(key))), None)
    if odd is not None:
        return (
            f"line {lines.get(str(odd), '?')}: a key that is not a name; expected {what} (the file's text is not shown)"
        )
    if keys and not any(ours(key) for key in keys):
        first = next(iter(keys))
        return f"line {lines.get(str(first), '?')}: no key of {what}; expected {what} (the file's text is not shown)"
    return None


def load(text: str, loader: type[yaml.SafeLoader] = UniqueKeyLoader):
    return yaml.load(text, Loader=loader)  # a SafeLoader subclass


def one_line(error: yaml.YAMLError) -> str:
    """The parser's error in one line: `line 4, column 2: expected <block end>, but found ...`
    (PyYAML's own text is up to 9 lines, with a copy of the file's lines and a caret)."""
    if isinstance(error, (DuplicateKeyError, AliasError)):
        return str(error)
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}not valid YAML ({problem})"
