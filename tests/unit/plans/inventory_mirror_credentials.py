"""Plan inventory: the production shape on Ubuntu 24.04 with mirrors that ask for a login
(cuda_repo_credentials_secret, base_pypi_index_credentials_secret), the gpu node its own builder."""

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host

from roles.site import vault
from validation import require_valid_inventory

# Passwords a shell, a netrc or an URL would misread: each must reach only the 0600 files.
CUDA_LOGIN = "cuda-user:plan-cuda-Pw$(touch${IFS}/tmp/x);#'x"
PYPI_LOGIN = "pypi-user:plan-pypi-Pw`id`|&%40:x"

_dir = Path(tempfile.mkdtemp(prefix="plan-mirror-credentials-"))
(_dir / "password").write_text("plan-password")
for name, value in (("cuda_login", CUDA_LOGIN), ("pypi_login", PYPI_LOGIN)):
    vault.set_secret(_dir / "secrets.vault.yml", name, value, b"plan-password")
os.environ["INFERENCE_HOST_VAULT_PASSWORD_FILE"] = str(_dir / "password")

_site = {
    "stack_file": "../../../inventory/stack.yml",
    "secrets_file": os.path.relpath(_dir / "secrets.vault.yml", Path(__file__).parent),
}

gpu_nodes = [
    (
        "@fake/gpu-mirrors",
        {
            **_site,
            **fake_host(
                "ubuntu2404",
                **{
                    # a builder with Docker-CE and buildx, a CUDA toolkit's cuobjdump and 16 cores
                    "buildx version": ["client /usr/bin/docker 27.3.1", "server 27.3.1", "buildx yes"],
                    "cuobjdump --version": ["/usr/local/cuda/bin/cuobjdump"],
                    "cat /proc/meminfo": ["cores 16", "MemTotal: 134217728 kB", "MemAvailable: 125829120 kB"],
                },
            ),
            "build_kernel_wheels": True,
            "gpu_count": 8,
            "cuda_repo_url": "https://mirror.example:8443/nvidia/cuda/repos",
            "cuda_repo_credentials_secret": "cuda_login",
            "base_pypi_index_url": "https://pypi.mirror.example/simple",
            "base_pypi_index_credentials_secret": "pypi_login",
        },
    )
]
builders = ["@fake/gpu-mirrors"]

require_valid_inventory(__file__, globals())
