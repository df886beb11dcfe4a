"""Templates rendered off the host, exactly as the deploy renders them: pyinfra's files.template
loads a jinja2 template with StrictUndefined and keeps the trailing newline (pyinfra/api/util.py
get_template, 3.10). The preview and the engine preflight on the control machine use this.

A template systemd reads (units, environment files: systemd_syntax.language_of) gets a
finalize hook that refuses any `{{ ... }}` value not encoded for its language; the deploy passes
the same hook to pyinfra through jinja_env_kwargs()."""

from __future__ import annotations

import jinja2

from roles.shared import systemd_syntax
from roles.site import PROJECT_ROOT


def environment(template: str | None = None) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(PROJECT_ROOT),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        **jinja_env_kwargs(template or ""),
    )


def jinja_env_kwargs(template: str) -> dict:
    """files.template(jinja_env_kwargs=...) for `template`: a fresh dict (pyinfra pops from it)."""
    finalize = systemd_syntax.finalize_for(template)
    return {"finalize": finalize} if finalize else {}


def render(template: str, **kwargs) -> str:
    """The text of a project template (a path from the project root) with these arguments."""
    return environment(template).get_template(template).render(**kwargs)
