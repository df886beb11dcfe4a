"""Templates rendered off the host, exactly as the deploy renders them: pyinfra's files.template
loads a jinja2 template with StrictUndefined and keeps the trailing newline (pyinfra/api/util.py
get_template, 3.10). The preview and the engine preflight on the control machine use this.

A template systemd reads (units, environment files: systemd_syntax.language_of) gets a
finalize hook that refuses any `{{ ... }}` value not encoded for its language; so does a shell
script (`*.sh.j2`, or a template starting with a `#!` line naming sh or bash): each value is built
by roles/shared/shell.py (a quoted word or command) or is a one-line comment text (shell.comment).
The deploy passes the same hooks to pyinfra through jinja_env_kwargs()."""

from __future__ import annotations

import jinja2

from roles.shared import systemd_syntax
from roles.shared.shell import Shell, ShellComment
from roles.site import PROJECT_ROOT


def environment(template: str | None = None) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(PROJECT_ROOT),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        **jinja_env_kwargs(template or ""),
    )


# The interpreter lines of the shell scripts the roles write (the launchers, the rolling script).
SHELL_INTERPRETERS = ("#!/bin/sh", "#!/bin/bash", "#!/usr/bin/env bash", "#!/usr/bin/env sh")


def is_shell_script(template: str) -> bool:
    """A snippet login shells source (`*.sh.j2`) or a script whose first line names sh or bash."""
    if template.endswith(".sh.j2"):
        return True
    path = PROJECT_ROOT / template
    if not template or not path.is_file():
        return False
    with path.open(encoding="utf-8") as text:
        first = text.readline().strip()
    return first.split()[0] in SHELL_INTERPRETERS if first.startswith("#!") else False


def jinja_env_kwargs(template: str) -> dict:
    """files.template(jinja_env_kwargs=...) for `template`: a fresh dict (pyinfra pops from it)."""
    finalize = _shell_finalize(template) if is_shell_script(template) else systemd_syntax.finalize_for(template)
    return {"finalize": finalize} if finalize else {}


def _shell_finalize(template: str):
    """Every `{{ ... }}` of a shell script is a Shell or a ShellComment, or rendering stops naming
    the template and the variable: a plain str there would be live shell text."""

    @jinja2.pass_context
    def finalize(context, value):
        if isinstance(value, (Shell, ShellComment)):
            return value
        name = next((k for k, v in context.get_all().items() if v is value), None)
        where = f"variable {name!r}" if name else "an expression (a loop variable or literal)"
        raise systemd_syntax.EncodingError(
            f"{template}: {where} is a {type(value).__name__}, not shell text; build it with"
            " roles/shared/shell.py (word(), argv(), sh(); comment() for a comment line)"
        )

    return finalize


def render(template: str, **kwargs) -> str:
    """The text of a project template (a path from the project root) with these arguments."""
    return environment(template).get_template(template).render(**kwargs)
