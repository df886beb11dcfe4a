"""The one error of the site model: a list of problems, each naming file, field, value and remedy."""

from __future__ import annotations

import difflib
import re
import sys
import traceback
import unicodedata
from pathlib import Path

from roles.site.credentials import masked

# Values echoed in a message are cut to this many characters: a 200,000-character value must
# not fill the terminal, and the start is enough to find it in the file.
SHOWN_CHARACTERS = 80


# Unicode categories no setting needs and a terminal does not show as what they are: controls
# (Cc), format characters (Cf: U+200B zero-width space, U+202E right-to-left override and the
# other bidi controls, U+FEFF), private use (Co), unassigned (Cn), line and paragraph separators;
# and spaces other than U+0020 (Zs: U+00A0, U+3000, ...), which look like the one space.
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cn", "Cs", "Zl", "Zp"})


def is_invisible(character: str) -> bool:
    category = unicodedata.category(character)
    return category in INVISIBLE_CATEGORIES or (category == "Zs" and character != " ")


def escaped(text: str) -> str:
    """text with every invisible character written as its escape (\\u200b): a key that ends in a
    zero-width space is not printed like the right one, a right-to-left override does not
    reorder the message around it."""
    return "".join(_escape(c) if is_invisible(c) else c for c in text)


def _escape(character: str) -> str:
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def hidden(text: str) -> str:
    """text with every credential-shaped part (credentials.py: detect-secrets' vendor shapes and
    ours) replaced by its first four characters and a mark: a message never prints one."""
    return masked(text)


class SiteError(Exception):
    """One or more problems in the user's input, each naming file, field, value and remedy.
    Every problem is kept with its invisible characters escaped."""

    def __init__(self, problems: list[str]):
        problems = [escaped(problem) for problem in problems]
        self.problems = problems
        super().__init__("\n".join(problems))


def shown_key(key) -> str:
    """A key as a message names it: bare when it is made of ASCII letters, digits and '_' (as
    every valid key is), else as ascii() writes it, quoted, so a trailing space, a look-alike
    letter or an integer key shows for what it is."""
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z0-9_]+", key):
        return key
    return ascii(key)


def unknown_keys(raw: dict, known: set, prefix: str, where: str, problems: list[str]) -> None:
    for key in raw:
        if key not in known:
            problems.append(
                f"{where}: unknown key {shown_key(prefix + str(key))} = {shown(raw[key])}; valid keys: "
                + ", ".join(sorted(prefix + k for k in known))
            )


def shown(value) -> str:
    """ascii(value) for a message (repr with every non-ASCII character escaped, so a look-alike
    Cyrillic 'е' shows as \\u0435 and an invisible one as its escape), credentials hidden, cut
    at SHOWN_CHARACTERS with the full length named."""
    text = hidden(ascii(value))
    if len(text) <= SHOWN_CHARACTERS:
        return text
    length = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} characters as written"
    return f"{text[:SHOWN_CHARACTERS]}… ({length})"


def python_error(error: BaseException, user_files: list[Path]) -> str:
    """`FILE:LINE: NameError: ...` for a Python error raised while an inventory (or its
    group_data) ran: the deepest frame in one of the user's files, without a traceback.

    pyinfra_cli/util.py (3.10) exec_file wraps it as UnexpectedExternalError(e, filename): the
    original is its `exception` (its click message attribute is never set, so str() of the
    wrapper itself fails)."""
    original = getattr(error, "exception", None) or error
    if isinstance(original, UnicodeDecodeError):
        return _not_utf8(original, user_files)
    if isinstance(original, SyntaxError) and original.filename:
        where = f"{display(Path(original.filename))}:{original.lineno}"
        return f"{where}: SyntaxError: {original.msg}"
    wanted = {p.resolve() for p in user_files}
    frames = traceback.extract_tb(original.__traceback__)
    mine = [
        f
        for f in frames
        if Path(f.filename).resolve() in wanted or Path(f.filename).resolve().parent.name == "group_data"
    ]
    # Never a frame of pyinfra's or Python's own code (`<frozen codecs>`, site-packages): the
    # user's file, else the project's module it imported, else the inventory without a line.
    root = Path(__file__).resolve().parents[2]
    ours = [
        f
        for f in frames
        if Path(f.filename).is_absolute()
        and Path(f.filename).resolve().is_relative_to(root)
        and ".venv" not in Path(f.filename).resolve().relative_to(root).parts
    ]
    frame = (mine or ours or [None])[-1]  # type: ignore[list-item]  # None: no frame of ours
    where = f"{display(Path(frame.filename))}:{frame.lineno}" if frame else display(user_files[0])
    message = str(original).splitlines()[0] if str(original) else ""
    moved = _moved_name(original)
    if moved:
        message = moved
    if len(message) > 2 * SHOWN_CHARACTERS:
        message = f"{message[: 2 * SHOWN_CHARACTERS]}… ({len(message)} characters)"
    return f"{where}: {type(original).__name__}" + (f": {message}" if message else "")


def _not_utf8(error: UnicodeDecodeError, user_files: list[Path]) -> str:
    """`FILE:LINE: byte 0xe9 is not UTF-8` for the user's file that cannot be read (pyinfra reads
    the inventory and group_data/*.py as UTF-8; the exception names only `<frozen codecs>`)."""
    folders = {Path(__file__).resolve().parents[2] / "group_data"} | {p.parent / "group_data" for p in user_files}
    candidates = [*user_files, *sorted(p for folder in folders if folder.is_dir() for p in folder.glob("*.py"))]
    for path in candidates:
        try:
            data = path.read_bytes()
            data.decode("utf-8")
        except UnicodeDecodeError as found:
            line = data.count(b"\n", 0, found.start) + 1
            return (
                f"{display(path)}:{line}: byte {data[found.start]:#04x} is not UTF-8; expected a UTF-8 text file"
                " (save it as UTF-8)"
            )
        except OSError:
            continue
    return f"{display(user_files[0])}: byte {error.object[error.start]:#04x} is not UTF-8; expected UTF-8 text files"


# Names an older inventory imports from where they no longer are: its one line says where they went.
MOVED_NAMES = {
    (
        "roles.site",
        "require_valid_inventory",
    ): "write `from validation import require_valid_inventory` (validation.py at the project root)",
}


def _moved_name(error: BaseException) -> str | None:
    """`X moved: ...` for `from roles.site import X` of a name in MOVED_NAMES (CPython's text:
    "cannot import name 'X' from 'module' (path)", Python/ceval.c import_from)."""
    found = (
        re.match(r"cannot import name '(\w+)' from '([\w.]+)'", str(error)) if isinstance(error, ImportError) else None
    )
    where_to = found and MOVED_NAMES.get((found.group(2), found.group(1)))
    return f"{found.group(1)} moved: {where_to}" if found and where_to else None


def display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def closest(key: str, candidates) -> str:
    match = difflib.get_close_matches(key, list(candidates), n=1)
    return f"; did you mean {match[0]}?" if match else ""


def print_problems(error: SiteError) -> None:
    print(f"inference-host: {len(error.problems)} problem(s) in the inventory; no host was contacted:", file=sys.stderr)
    for problem in error.problems:
        print(f"  - {problem}", file=sys.stderr)


def output_path_problem(flag: str, path: Path, folder: bool = False) -> str | None:
    """Why a command cannot write its output at path (checked before it connects to anything:
    a run of minutes must not end at writing its report), or None. folder: the path is a
    folder the command fills (made when missing), else a file. The folder it goes in must
    exist: a mistyped path is refused rather than made."""
    import os

    path = Path(path).expanduser()
    what = "a folder" if folder else "a file path"
    if folder and path.exists() and not path.is_dir():
        return f"{flag} {shown(str(path))} is a file; expected {what} (new or existing)"
    if not folder and path.is_dir():
        return f"{flag} {shown(str(path))} is a folder; expected {what}"
    parent = path.parent
    if not parent.is_dir():
        kind = "a file" if parent.exists() else "missing"
        return f"{flag} {shown(str(path))}: {shown(str(parent))} is {kind}; expected {what} in an existing folder"
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return f"{flag} {shown(str(path))}: not writable by this user; expected {what} you can write"
    return None
