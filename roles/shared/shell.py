"""The one builder of the command lines pyinfra runs as root through `sh -c`.

A root shell is a language: a space splits a word, `$(...)` and backquotes run commands, `;`,
`|` and `&` chain them, `*` and `?` expand. So a command line is never formatted from a value.
The shape is a literal template and every value is a separate keyword, quoted for POSIX sh
with `shlex.quote` (the quoting pyinfra's own `QuoteString` applies, pyinfra/api/command.py in
3.10):

    sh("rm -rf -- {prefix} && python3 -m venv -- {prefix}", prefix=value)
    sh("site=$(echo {target}/lib/python3*/site-packages)", target=value)   # the glob stays a glob
    argv("qm", "set", vmid, *arguments)                                   # a ready argument vector

What makes a value safe here, not merely quoted:

- a value is one word: `'/opt/uv tools'` stays one argument; a list or tuple is one word per
  item (`{packages}` with ["git", "jq"]);
- a field sits outside the template's own quotes (a quoted word inside "..." would keep its
  quotes), which the builder refuses;
- a value that starts a word and begins with `-` would be read as an option. It is refused
  unless a literal `--` ends the options earlier in the same simple command. apt-get, for one,
  treats any word starting with `-` as an option (`-oDpkg::Pre-Invoke::=...` runs a command as
  root), so its package names are always refused there;
- a NUL cannot be in an argument (execve(2) ends the word there), so it is refused;
- a field inside a here-document's body is refused: the body is not shell words, so quoting does
  nothing there, and an unquoted delimiter (`<<EOF`) runs `$(...)` and backquotes in it;
- only str, int and os.PathLike values: a bool or None formatted into a command is a bug.

The result is a `Shell`, a str, so pyinfra, the preview and the fact batch take it unchanged.
A `Shell` passed as a value is a piece already built and goes in as it is (one command inside
another's `sh -c` is quoted instead: pass it as a plain str). `tests/unit/test_shell_builder.py`
checks over the code that every command reaching pyinfra is built here, and
`tests/unit/test_shell_read_back.py` runs the roles' commands through a real `sh` with hostile
values and compares the argument vectors the programs received.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable
from string import Formatter

__all__ = ["Shell", "ShellComment", "argv", "chain", "comment", "from_pyinfra", "sh", "word"]


class Shell(str):
    """A command line (or one word) from this module's builders: every value in it quoted. Only
    this module makes one; tests/unit/test_shell_builder.py holds the rest of the code to that."""

    __slots__ = ()


class ShellComment(str):
    """Text for a `#` comment line of a shell script: one line, no control characters. Never a
    command: a shell-script template takes it only where its line is a comment already."""

    __slots__ = ()


Value = str | int | os.PathLike | Shell

# Where a field starts a new shell word: after blanks or an operator (or at the very start).
_WORD_START = set(" \t\n;|&(`")
# A here-document's operator and delimiter word (`<<EOF`, `<<-'EOF'`, `<< "EOF"`), not `<<<`.
_HERE_DOCUMENT = re.compile(r"(?<!<)<<(?!<)-?[ \t]*(['\"]?)([A-Za-z0-9_.-]+)\1")
# Operators that begin a new simple command, so an earlier `--` no longer applies.
_COMMAND_BREAK = re.compile(r"&&|\|\||[;|&\n(`]|\$\(")


def sh(template: str, /, **values: Value | Iterable[Value]) -> Shell:
    """The command line of `template` (a literal) with each {field} replaced by its value, quoted."""
    if isinstance(template, Shell) or not isinstance(template, str):
        raise TypeError("sh(): the template is a literal str, the values are keywords")
    parts = list(Formatter().parse(template))
    out: list[str] = []
    literal = ""  # the template's own text so far, fields left out (for quotes and `--`)
    for index, (text, field, spec, conversion) in enumerate(parts):
        out.append(text)
        literal += text
        if field is None:
            continue
        if spec or conversion or not field.isidentifier():
            raise ValueError(f"sh(): write {{{field}}} plainly, the builder quotes it ({template!r})")
        if field not in values:
            raise KeyError(f"sh(): no value for {{{field}}} in {template!r}")
        _outside_quotes(literal, field, template)
        _outside_here_document(literal, field, template)
        after = parts[index + 1][0] if index + 1 < len(parts) else ""
        out.append(_render(values[field], field, literal, after, template))
    unused = set(values) - {f for _, f, _, _ in parts if f}
    if unused:
        raise KeyError(f"sh(): values {sorted(unused)} are not in {template!r}")
    return Shell("".join(out))


def argv(*words: Value) -> Shell:
    """One command from an argument vector: each word quoted, none split or expanded."""
    if not words:
        raise ValueError("argv(): an empty command")
    return Shell(" ".join(_quote(w, "argv") for w in words))


def word(value: Value) -> Shell:
    """One value as one quoted shell word, for a template of a shell script (`{{ cuda_home }}`)."""
    return Shell(_quote(value, "word"))


def comment(value: str | int) -> ShellComment:
    """A value for a shell script's comment (`# the {{ engine_label }} server`): a newline would end
    the comment and start a command, so it and every other control character are refused."""
    text = str(value)
    bad = next((c for c in text if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if isinstance(value, bool) or bad is not None:
        raise ValueError(f"comment(): {text!r} holds {bad!r}, which would end the comment line")
    return ShellComment(text)


def chain(*commands: Shell, operator: str = "&&") -> Shell:
    """Commands built here, joined by `&&`, `||`, `;` or a newline."""
    if operator not in ("&&", "||", ";", "\n"):
        raise ValueError(f"chain(): {operator!r} is not a command separator")
    for command in commands:
        if not isinstance(command, Shell):
            raise TypeError(f"chain(): {command!r} was not built by sh() or argv()")
    separator = "\n" if operator == "\n" else f" {operator} "
    return Shell(separator.join(commands))


def from_pyinfra(command: str) -> Shell:
    """A command pyinfra made itself (its own facts and operations quote their values with
    QuoteString) or one built here, taken as it is: only roles/shared/fact_batch.py, which runs
    the facts' commands of a host as one script, needs this."""
    if not isinstance(command, str):
        raise TypeError(f"from_pyinfra(): {command!r} is not a rendered command")
    return Shell(command)


def _render(value: object, field: str, literal: str, after: str, template: str) -> str:
    if isinstance(value, Shell):
        return value
    if isinstance(value, (list, tuple)):
        if not (_starts_word(literal) and (not after or after[0] in _WORD_START)):
            raise ValueError(f"sh(): {{{field}}} is a list, so it must be whole words in {template!r}")
        return " ".join(_word(v, field, literal, template) for v in value)
    return _word(value, field, literal, template)


def _word(value: object, field: str, literal: str, template: str) -> str:
    quoted = _quote(value, field)
    text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    if text.startswith("-") and _starts_word(literal) and not _options_ended(literal):
        raise ValueError(
            f"{text!r} (for {{{field}}}) would be read as an option: it starts with '-'"
            f" and no '--' ends the options before it in {template!r}"
        )
    return quoted


def _quote(value: object, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, os.PathLike)):
        raise TypeError(f"{field}: {value!r} is not a str, int or path")
    text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    if not isinstance(text, str) or "\0" in text:
        raise ValueError(f"{field}: {text!r} holds a NUL, which no argument can")
    return shlex.quote(text)


def _starts_word(literal: str) -> bool:
    return not literal or literal[-1] in _WORD_START


def _options_ended(literal: str) -> bool:
    command = _COMMAND_BREAK.split(literal)[-1]
    return "--" in command.split()


def _outside_quotes(literal: str, field: str, template: str) -> None:
    """Refuses a field inside the template's own '...' or "..." (a `$(...)` opens a new level)."""
    stack = [""]  # "" top level or inside $( ), "'" or '"' inside those quotes
    index = 0
    while index < len(literal):
        char, top = literal[index], stack[-1]
        if top == "'":
            if char == "'":
                stack.pop()
        elif char == "\\":
            index += 1
        elif top == '"' and literal.startswith("$(", index):
            stack.append("")
            index += 1
        elif top == '"' and char == '"':
            stack.pop()
        elif top == "" and char in "'\"":
            stack.append(char)
        elif top == "" and literal.startswith("$(", index):
            stack.append("")
            index += 1
        elif top == "" and char == ")" and len(stack) > 1:
            stack.pop()
        index += 1
    if stack[-1]:
        quote = stack[-1]
        raise ValueError(f"sh(): {{{field}}} is inside {quote}...{quote} in {template!r}; the builder quotes it")


def _outside_here_document(literal: str, field: str, template: str) -> None:
    """Refuses a field in the body of a here-document: after the newline that ends the line of a
    `<<WORD` and before the line that is WORD (or tabs and WORD, for `<<-`)."""
    for opener in _HERE_DOCUMENT.finditer(literal):
        line_end = literal.find("\n", opener.end())
        if line_end < 0:
            continue  # the field is still on the operator's own line: shell words
        body_lines = literal[line_end + 1 :].split("\n")
        closed = any(line.lstrip("\t") == opener.group(2) for line in body_lines[:-1])
        if not closed:
            raise ValueError(
                f"sh(): {{{field}}} is inside the here-document <<{opener.group(2)} in {template!r}, where quoting"
                " does nothing; pass the text on stdin or as an argument instead"
            )
