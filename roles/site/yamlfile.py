"""Reading the project's YAML files (the stack file, the vault): a key written twice is refused,
and a parser error is one line that names the file, the line and the column.

PyYAML's SafeLoader keeps the last of two equal keys without a word (yaml/constructor.py,
SafeConstructor.construct_mapping: a plain dict assignment), so a second `active:` in the stack
file, or a second secret of one name, silently replaced the first.
"""

from __future__ import annotations

import yaml


class DuplicateKeyError(yaml.YAMLError):
    """A mapping with one key twice: the key and both lines (1-based)."""

    def __init__(self, key, first_line: int, second_line: int):
        self.key, self.first_line, self.second_line = key, first_line, second_line
        super().__init__(f"key {key!r} is written twice (lines {first_line} and {second_line}); expected each key once")


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with a key written twice."""

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


def load(text: str, loader: type[yaml.SafeLoader] = UniqueKeyLoader):
    return yaml.load(text, Loader=loader)  # a SafeLoader subclass


def one_line(error: yaml.YAMLError) -> str:
    """The parser's error in one line: `line 4, column 2: expected <block end>, but found ...`
    (PyYAML's own text is up to 9 lines, with a copy of the file's lines and a caret)."""
    if isinstance(error, DuplicateKeyError):
        return str(error)
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}not valid YAML ({problem})"
