"""Templates rendered off the host, exactly as the deploy renders them: pyinfra's files.template
loads a jinja2 template with StrictUndefined and keeps the trailing newline (pyinfra/api/util.py
get_template, 3.10). The preview and the engine preflight on the control machine use this."""

from __future__ import annotations

import jinja2

from roles.site import PROJECT_ROOT


def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(PROJECT_ROOT), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True)


def render(template: str, **kwargs) -> str:
    """The text of a project template (a path from the project root) with these arguments."""
    return environment().get_template(template).render(**kwargs)
