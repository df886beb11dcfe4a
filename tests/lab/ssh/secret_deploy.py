"""A one-operation deploy for tests/lab/test_secret_files_ssh.py: one secret file, written the
way roles/shared/secret_files.py writes it, or (IH_SSH_PLANT=files.put) the way pyinfra's own
files.put would, to prove the test sees the difference."""

import os
from io import StringIO

from pyinfra.operations import files

from roles.shared.secret_files import UPLOAD_DIR, secret_file

DEST, VALUE = os.environ["IH_SSH_DEST"], os.environ["IH_SSH_VALUE"]

if os.environ.get("IH_SSH_PLANT") == "files.put":
    files.directory(name="Create the root-only upload folder", path=UPLOAD_DIR, mode="0700")
    files.put(
        name=f"Planted: files.put {DEST}",
        src=StringIO(VALUE),
        dest=DEST,
        user="nobody",
        group="nogroup",
        mode="0600",
        _temp_dir=UPLOAD_DIR,
    )
else:
    secret_file(label="a planted secret", value=VALUE, dest=DEST, user="nobody", group="nogroup")
