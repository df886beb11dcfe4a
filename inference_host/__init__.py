"""The `inference-host` command (cli.py) and the day-two operations it runs (operations.py).

Above the roles, like deploy.py and roles/render.py: it reads the site model, runs the project's
modules and reaches hosts; nothing of the project imports it (tests/unit/test_layout.py).
"""
