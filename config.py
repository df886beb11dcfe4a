"""pyinfra's config file: pyinfra_cli/cli.py (3.x) runs it from the folder pyinfra is started
in, before it loads the inventory. The project sets no pyinfra option here. It makes a Python
error in an inventory one line (`inventory/x.py:12: NameError: ...`, exit 2, nothing
contacted), as `inference-host validate` prints it, instead of pyinfra's traceback; and it asks the
file and package facts a host was asked last time in one command (roles/shared/fact_batch.py
says how an answer is kept honest), which is most of what a no-change run used to wait for;
and pyinfra orders operations from the call stack without reading source lines
(roles/shared/call_stack.py), most of what planning cost; a host whose SSH key is not the
pinned one is one line with both fingerprints (roles/shared/host_key_check.py), which stops the
deploy. A host pyinfra cannot connect to is recorded for `inference-host deploy`'s exit status
3, NO_COLOR is honoured, and an operation longer than 10 s says so at a terminal
(roles/shared/cli_edges.py)."""

from roles.shared.call_stack import install as order_without_source
from roles.shared.cli_edges import honour_no_color, record_unreached_hosts, say_long_operations
from roles.shared.fact_batch import install as batch_facts
from roles.shared.host_key_check import install as one_line_host_key
from roles.site.loading import one_line_inventory_errors

one_line_inventory_errors()
batch_facts()
order_without_source()
one_line_host_key()
record_unreached_hosts()
honour_no_color()
say_long_operations()
