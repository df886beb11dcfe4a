"""Site-wide defaults every inventory shares (pyinfra reads group_data/<group>.py by itself).

Per-host values belong in the inventory files; the defaults of every setting live in
roles/site/ and are listed in docs/settings.md (generated from the model). The service user and
its directories are the model's defaults (base_service_user `inference`, base_data_dir
/var/lib/inference-engine, base_log_dir /var/log/inference-engine): one place says them.
"""
