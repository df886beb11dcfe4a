"""pyinfra's config file: pyinfra_cli/cli.py (3.x) runs it from the folder pyinfra is started
in, before it loads the inventory. The project sets no pyinfra option here; it only makes a
Python error in an inventory one line (`inventory/x.py:12: NameError: ...`, exit 2, nothing
contacted), as `python -m roles.site` prints it, instead of pyinfra's traceback."""

from roles.site.loading import one_line_inventory_errors

one_line_inventory_errors()
