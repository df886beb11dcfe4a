"""Site-wide defaults every inventory shares (pyinfra reads group_data/<group>.py by itself).

Per-host values belong in the inventory files; the defaults of every setting live in
roles/site/ and are listed in docs/settings.md (generated from the model).
"""

# The engine runs as this unprivileged user; it owns the model and data directories.
base_service_user = "sglang"
base_service_group = "sglang"
