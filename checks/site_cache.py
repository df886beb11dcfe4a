"""The site model of an inventory, loaded once per health-check process.

One `python -m checks` run asks for the same inventory's site many times: the command
line's checks, pytest's configure and collection hooks (once per parametrized test function),
each host's expectations. Loading it means running the inventory file and its group data
through pyinfra's loader and typing every host (roles/site/loading.py), about 0.4-0.7 s each on a
loaded 2-core machine; measured 22 loads, 14.8 s of a 21 s run (cProfile). The inventory does
not change while one process checks it, so it is loaded once per path.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from roles.site import Site, load_site


def site_of(inventory_file: str | os.PathLike) -> Site:
    path = Path(inventory_file)
    try:
        stamp = path.stat().st_mtime_ns  # an edited file (a test that rewrites it) loads again
    except OSError:
        stamp = None  # load_site names the missing file
    return _site_of(str(path.resolve()), stamp, str(inventory_file))


@functools.cache
def _site_of(resolved: str, stamp: int | None, as_given: str) -> Site:
    # Loaded by the name as given: the model's messages name the file the way the user did.
    return load_site(as_given)
