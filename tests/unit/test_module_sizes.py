"""A size ratchet (tests/unit/module_sizes.py): no module grows past max(400 lines, its record)."""

from __future__ import annotations

import json

from tests.unit import module_sizes


def test_no_module_grows_past_its_ceiling():
    record = json.loads(module_sizes.RECORD.read_text())
    found = module_sizes.problems(module_sizes.modules(), record)
    assert not found, "\n".join(found)


def test_the_ratchet_catches_growth_a_new_big_module_and_a_stale_record():
    sizes = {"zz/a.py": 900, "zz/b.py": 401, "zz/c.py": 300, "zz/d.py": 500}
    record = {"zz/a.py": 899, "zz/d.py": 600, "zz/gone.py": 700}
    found = module_sizes.problems(sizes, record)
    assert [line.split(":")[0] for line in found] == ["zz/a.py", "zz/b.py", "zz/d.py", "zz/gone.py"]
    assert module_sizes.problems({"zz/a.py": 899, "zz/c.py": 400}, {"zz/a.py": 899}) == []
