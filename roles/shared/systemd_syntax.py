"""Values encoded for what systemd reads: unit files (systemd.syntax(7), systemd.unit(5),
systemd.exec(5)) and EnvironmentFiles. One encoder per kind of value; templates that systemd
reads take only their results (roles/shared/templates.py refuses anything else).

What each encoder relies on, as systemd 252 (Debian 12) and 255 (Ubuntu 24.04) parse it
(systemd/systemd, the v252 and v255 tags):

- src/shared/conf-parser.c (config_parse): one setting a line; the value is stripped of leading
  and trailing whitespace; a line ending in an odd number of backslashes continues on the next
  line; lines starting with `#` or `;` are comments.
- src/shared/specifier.c (specifier_printf) via unit_full_printf / unit_path_printf
  (src/core/unit-printf.c): `%x` is a specifier, `%%` a literal `%`, an unknown one an error.
- src/basic/extract-word.c (extract_first_word): words split on whitespace; inside "..." a
  backslash takes the next character literally (with EXTRACT_CUNESCAPE also C escapes: `\\`,
  `\"` read the same either way), so a quoted word keeps its spaces, `#`, `;` and quotes.
- src/core/load-fragment.c, per setting:
  - Description=, User=, SyslogIdentifier= (config_parse_unit_string_printf and friends):
    the whole value, specifier-expanded, never unquoted;
  - ReadWritePaths=, ReadOnlyPaths=, ... (config_parse_namespace_path_strv): words, EXTRACT_UNQUOTE,
    then unit_path_printf and path_simplify (a trailing or doubled `/` is dropped);
  - WorkingDirectory=, EnvironmentFile=, AssertPathExists= (config_parse_working_directory,
    config_parse_unit_env_file, config_parse_unit_condition_path): the whole value as ONE path,
    specifier-expanded, not split and not unquoted (a leading `-` there means "optional");
  - Environment= (config_parse_environ): words, EXTRACT_CUNESCAPE|EXTRACT_UNQUOTE, each
    specifier-expanded, then env_assignment_is_valid;
  - ExecStart= and friends (config_parse_exec): prefixes (`-+!@:`) read before the first word,
    then words with EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE and specifiers; a lone unquoted `;`
    separates commands; at start, src/basic/env-util.c replace_env_argv expands `$NAME` and
    `${NAME}` and reads `$$` as `$`.
- src/basic/env-file.c (load_env_file, parse_env_file_internal; EnvironmentFile= and Debian's
  /etc/default files): KEY=VALUE, inside "..." a backslash escapes only `"`, `\\`, `` ` `` and
  `$` (SHELL_NEED_ESCAPE) and is kept before any other character, a raw newline is part of the
  value; no specifier expansion. A value with control characters other than tab and newline
  is dropped at start (src/basic/env-util.c env_value_is_valid, string_has_cc), so it is refused.

What cannot be encoded (NUL, a line break in a one-line value, a relative path) raises
EncodingError naming the setting.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


class EncodingError(ValueError):
    """A value that systemd cannot read back unchanged."""


class Encoded(str):
    """Text already encoded for one file language; only this module makes one."""

    language = "?"


class UnitText(Encoded):
    """Text encoded for a systemd unit file."""

    language = "systemd unit"


class EnvFileText(Encoded):
    """Text encoded for a systemd EnvironmentFile (and Debian's /etc/default files)."""

    language = "EnvironmentFile"


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SHELL_NEED_ESCAPE = '"\\`$'  # src/basic/string-util.h (252, 255)


def _control(value: str, allowed: str = "") -> str | None:
    for char in value:
        if (ord(char) < 0x20 or ord(char) == 0x7F) and char not in allowed:
            return repr(char)
    return None


def _check(what: str, value: object, *, allowed_controls: str = "") -> str:
    if not isinstance(value, str):
        raise EncodingError(f"{what}: expected text, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise EncodingError(f"{what}: not valid UTF-8 (a lone surrogate)") from None
    bad = _control(value, allowed_controls)
    if bad:
        raise EncodingError(f"{what}: the control character {bad} cannot be written to a systemd file")
    return value


def _specifiers(value: str) -> str:
    return value.replace("%", "%%")


# Words made only of these read the same quoted or not; they stay bare, as a person writes them.
_BARE = re.compile(r"[A-Za-z0-9_./:,+=@%-]+\Z")


def _quoted(value: str) -> str:
    """One word as extract_first_word unquotes it (with or without EXTRACT_CUNESCAPE)."""
    if _BARE.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ----- unit files -----


def text(value: str, what: str = "value") -> UnitText:
    """Free text read whole and specifier-expanded (Description=, User=, SyslogIdentifier=):
    `%` doubled. Leading or trailing blanks would be stripped and a trailing backslash would
    join the next line, so those are refused."""
    value = _check(what, value)
    if not value.strip():
        raise EncodingError(f"{what}: empty; systemd would treat it as unset")
    if value != value.strip(" \t"):
        raise EncodingError(f"{what}: leading or trailing blanks would be dropped by systemd: {value!r}")
    if value.endswith("\\"):
        raise EncodingError(f"{what}: a trailing backslash would join the next line: {value!r}")
    return UnitText(_specifiers(value))


def comment(value: object, what: str = "value") -> UnitText:
    """Text inside a `#` comment line of a unit or environment file: no line break, and no
    trailing backslash (env-file.c before v254 continues a comment ending in one)."""
    value = _check(what, str(value))
    if value.endswith("\\"):
        raise EncodingError(f"{what}: a trailing backslash would continue the comment: {value!r}")
    return UnitText(value)


def number(value: int | float, what: str = "value") -> UnitText:
    """A number (or a time span in seconds) as systemd's parsers read it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EncodingError(f"{what}: expected a number, got {type(value).__name__}")
    return UnitText(str(value))


def _absolute(value: str, what: str) -> str:
    value = _check(what, value)
    if not value.startswith("/"):
        raise EncodingError(f"{what}: systemd takes absolute paths only, not {value!r}")
    if ".." in value.split("/"):
        # path_simplify_and_warn(PATH_CHECK_NORMALIZED) ignores the setting (src/basic/path-util.c).
        raise EncodingError(f"{what}: systemd ignores a path with a '..' part: {value!r}")
    return value


def path(value: str, what: str = "path") -> UnitText:
    """One path read whole (WorkingDirectory=, EnvironmentFile=, AssertPathExists=): `%`
    doubled, never quoted (those settings do not unquote). Blanks at either end would be
    stripped, so they are refused; spaces inside are kept."""
    value = _absolute(value, what)
    if value != value.strip(" \t") or value.endswith("\\"):
        raise EncodingError(f"{what}: systemd strips blanks at the ends of {value!r}")
    return UnitText(_specifiers(value))


def path_list(values: Iterable[str], what: str = "path") -> UnitText:
    """Paths of a list setting (ReadWritePaths=, ReadOnlyPaths=, ...): each quoted, so a path
    with a space stays one path, with `%` doubled."""
    return UnitText(" ".join(_quoted(_specifiers(_absolute(v, what))) for v in values))


def word_list(values: Iterable[str], what: str = "value") -> UnitText:
    """Words of a list setting that unquotes and expands specifiers (Documentation=)."""
    return UnitText(" ".join(_quoted(_specifiers(_check(what, v))) for v in values))


def environment(name: str, value: str, what: str = "") -> UnitText:
    """One Environment= assignment: `"NAME=value"` quoted, `%` doubled ($ is not expanded there)."""
    what = what or f"Environment {name}"
    _env_name(name, what)
    return UnitText(_quoted(_specifiers(f"{name}={_check(what, value, allowed_controls=chr(9))}")))


def argv(words: Iterable[str], what: str = "command") -> UnitText:
    """ExecStart= and friends: every word quoted, `%` doubled, `$` doubled (replace_env_argv
    reads `$$` as `$`). The first word must be an absolute path; a prefix such as `+` goes
    before the encoded command in the template."""
    words = [_check(what, w, allowed_controls=chr(9)) for w in words]
    if not words or not words[0].startswith("/"):
        raise EncodingError(f"{what}: the program must be an absolute path, not {words[:1]!r}")
    return UnitText(" ".join(_quoted(_specifiers(w).replace("$", "$$")) for w in words))


def transient_argv(words: Iterable[str], what: str = "command") -> list[str]:
    """The command of `systemd-run` (a transient service): its words reach the manager over D-Bus
    unquoted and without specifiers, but are still expanded like ExecStart= (`${NAME}`, a whole-word
    `$NAME`; `$$` is `$`): each `$` doubled. systemd-run 252 has no switch to turn that off;
    254+ has --expand-environment=no, with expansion on by default (systemd-run(1))."""
    return [_check(what, w, allowed_controls="\t").replace("$", "$$") for w in words]


def _env_name(name: str, what: str) -> None:
    if not isinstance(name, str) or not _ENV_NAME.match(name):
        raise EncodingError(
            f"{what}: {name!r} is not a valid environment variable name "
            "(letters, digits, underscore; not starting with a digit)"
        )


# ----- EnvironmentFile -----


def env_value(value: object, what: str = "value") -> EnvFileText:
    """One value of an EnvironmentFile, double-quoted with `"`, `\\`, `` ` `` and `$` escaped;
    a newline is kept (inside quotes it is part of the value), other control characters refused
    (as anything but text)."""
    text = _check(what, value, allowed_controls="\t\n")
    if _BARE.match(text):
        return EnvFileText(text)
    return EnvFileText('"' + "".join("\\" + c if c in _SHELL_NEED_ESCAPE else c for c in text) + '"')


def env_assignment(name: str, value: str | int | float, what: str = "") -> EnvFileText:
    """`NAME="value"`: one assignment line of an EnvironmentFile."""
    what = what or f"environment variable {name}"
    _env_name(name, what)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    return EnvFileText(f"{name}={env_value(value, what)}")


def env_words(words: Iterable[str], what: str = "arguments") -> EnvFileText:
    """A value that a unit uses as `$NAME` in ExecStart= (Debian's ARGS in /etc/default):
    replace_env_argv splits it into words with EXTRACT_UNQUOTE, so each word is quoted for that
    first, then the whole for the env file."""
    return env_value(" ".join(_quoted(_check(what, w, allowed_controls="\t")) for w in words), what)


def env_comment(value: object, what: str = "value") -> EnvFileText:
    """Text inside a `#` comment of an EnvironmentFile (see comment())."""
    return EnvFileText(comment(value, what))


# ----- the rule templates follow -----

LANGUAGES: dict[str, type[Encoded]] = {
    ".service.j2": UnitText,
    ".timer.j2": UnitText,
    ".socket.j2": UnitText,
    ".env.j2": EnvFileText,
    ".default.j2": EnvFileText,
}


def language_of(template: str) -> type[Encoded] | None:
    """The encoded type a template takes, from its name; None for files systemd does not read."""
    return next((kind for suffix, kind in LANGUAGES.items() if template.endswith(suffix)), None)


def finalize_for(template: str):
    """jinja2's finalize hook for `template`: every `{{ ... }}` must be a value of the file's
    language, or rendering stops naming the template and the variable."""
    kind = language_of(template)
    if kind is None:
        return None
    import jinja2

    @jinja2.pass_context
    def finalize(context, value):
        if isinstance(value, kind):
            return value
        name = next((k for k, v in context.get_all().items() if v is value), None)
        where = f"variable {name!r}" if name else "an expression (a loop variable or literal)"
        raise EncodingError(
            f"{template}: {where} is a {type(value).__name__}, not {kind.language} text; "
            f"encode it with roles/shared/systemd_syntax.py"
        )

    return finalize
