"""roles/base: packages, the service user, directories, kernel and limits tuning, uv (base_*)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from roles.site.fields import (
    _RULE_TEXT,
    UNIX_NAME_RE,
    DebianPackages,
    HostFolder,
    MirrorUrl,
    SecretName,
    Section,
    SysctlSettings,
    Url,
    check,
    positive,
)
from roles.site.grammars import ACCOUNT_TEXT, service_account_problem

# A CA file is uploaded 0644 into the system bundle (roles/shared/extra_cas.py): it must hold
# certificates and nothing else. Parsed with the `cryptography` package (already the controller's,
# through ansible-core): x509.load_pem_x509_certificates reads every PEM certificate of a
# bundle; a PRIVATE KEY block (a key pasted with its certificate) is refused before that.
MAX_CA_FILE_BYTES = 1 << 20


def ca_file_problem(path: str) -> str | None:
    """Why path is not a readable PEM file of certificates only, or None."""
    try:
        if Path(path).stat().st_size > MAX_CA_FILE_BYTES:
            return f"{path!r} is over {MAX_CA_FILE_BYTES} bytes"
        data = Path(path).read_bytes()
    except OSError as error:
        return f"{path!r} cannot be read ({error.strerror})"
    if re.search(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----", data):
        return f"{path!r} holds a private key, which must never be uploaded (0644) with the certificates"
    from cryptography import x509
    from cryptography.utils import CryptographyDeprecationWarning

    try:
        with warnings.catch_warnings():
            # A system bundle given whole holds old CAs with a serial number RFC 5280 disallows
            # (not positive): cryptography 50 reads them and warns; they are the distribution's.
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            certificates = x509.load_pem_x509_certificates(data)
    except ValueError as error:
        return f"{path!r} is not PEM X.509 certificates ({str(error)[:80]})"
    return None if certificates else f"{path!r} holds no certificate"


def _ca_file(value: str) -> str:
    problem = ca_file_problem(value)
    if problem:
        raise PydanticCustomError(
            "inference_host", "{valid}", {"valid": f"a local PEM file of X.509 certificates only; {problem}"}
        )
    return value


# A local PEM file of CA certificates (serving_tls_ca_file), checked as base_extra_ca_certificates are.
CaFile = Annotated[str, AfterValidator(_ca_file)]


def _ca_files(value: list[str]) -> list[str]:
    problem = next((p for path in value if (p := ca_file_problem(path))), None)
    if problem:
        raise PydanticCustomError(
            "inference_host", "{valid}", {"valid": f"local PEM files of X.509 certificates only; {problem}"}
        )
    return value


def _account(group: bool) -> AfterValidator:
    def run(value: str) -> str:
        problem = "it is not one" if not UNIX_NAME_RE.match(value) else service_account_problem(value, group)
        if problem:
            raise PydanticCustomError("inference_host", "{valid}", {"valid": f"{ACCOUNT_TEXT}; {problem}"})
        return value

    validator = AfterValidator(run)
    _RULE_TEXT[id(validator)] = ACCOUNT_TEXT
    return validator


ServiceAccount = Annotated[str, _account(group=False)]
ServiceGroup = Annotated[str, _account(group=True)]


class BaseSettings(Section):
    """roles/base: packages, the service user, directories, kernel and limits tuning, uv."""

    PREFIX: ClassVar[str] = "base_"

    # Never root: the engine serves the network and, with serving_trust_remote_code, runs the
    # model folder's Python; as root one bug or one tampered model file owns the host, and the
    # unit's sandbox (ProtectSystem=, ReadWritePaths=) no longer holds it.
    service_user: ServiceAccount = Field(
        "inference",
        description=(
            "Unprivileged system user (no login shell) the engine runs as; owns the data, model and log directories."
        ),
    )
    service_group: ServiceGroup = Field("inference", description="Primary group of base_service_user.")
    install_root: HostFolder = Field(
        "/opt/inference-host",
        description=(
            "Root of the engine environments (envs/<stack>-<stamp>) and of the `current` link the unit runs through."
        ),
    )
    # The data and log directories are named after the unit (inference-engine.service), as
    # systemd's StateDirectory= and LogsDirectory= name theirs.
    data_dir: HostFolder = Field(
        "/var/lib/inference-engine",
        description=(
            "The service user's data directory (mode 0750): HF_HOME and the Hugging Face token live under it."
        ),
    )
    model_dir: HostFolder = Field(
        "/models", description=("Directory for models on the gpu node (mode 0750), owned by the service user.")
    )
    log_dir: HostFolder = Field(
        "/var/log/inference-engine",
        description=("The engine's log directory (mode 0750), writable inside the unit's sandbox."),
    )
    uv_dir: HostFolder = Field(
        "/opt/uv",
        description=("Where uv is installed from PyPI: <dir>/<version>, a venv linked from /usr/local/bin/uv."),
    )
    extra_packages: DebianPackages = Field([], description=("More apt packages installed with the base set."))
    sysctl: SysctlSettings = Field(
        {"kernel.numa_balancing": "0"},
        description=(
            "sysctl settings written to /etc/sysctl.d/90-inference-host-sysctl.conf; automatic NUMA "
            "page migration hurts GPU-bound serving, so kernel.numa_balancing is 0. Applied on a VM or"
            " bare metal, not inside a container."
        ),
    )
    limit_nofile: Annotated[int, positive] = Field(
        1048576, description=("Open-file limit (limits.d and the unit's LimitNOFILE).")
    )
    limit_memlock: Annotated[
        str, check(lambda v: v == "unlimited" or str(v).isdigit(), "'unlimited' or a number of KiB")
    ] = Field(
        "unlimited", description=("Locked-memory limit in KiB, or 'unlimited' (pinned host memory for NCCL and CUDA).")
    )
    extra_ca_certificates: Annotated[list[str], AfterValidator(_ca_files)] = Field(
        [],
        description=(
            "Local PEM files trusted on the host in addition to the distribution's CAs (a TLS-inspecting proxy)."
        ),
    )
    pypi_index_url: MirrorUrl | None = Field(
        None,
        description=(
            "A PyPI mirror for every install and kernel-wheel build (UV_INDEX_URL, PIP_INDEX_URL); None: pypi.org."
            " Without a credential in it: a mirror that needs one takes it from base_pypi_index_credentials_secret."
        ),
    )
    pypi_index_credentials_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key of the login:password the base_pypi_index_url mirror asks for (an https URL); written only"
            " into a 0600 root netrc file that uv, pip and the kernel-wheel builds read (NETRC, a BuildKit"
            " secret), never into a URL, a command line or a build argument."
        ),
    )
    python_install_mirror: Url | None = Field(
        None,
        description=(
            "Where uv downloads its managed CPython (UV_PYTHON_INSTALL_MIRROR) for every environment it builds"
            " (engines, gateway, monitoring, the training job); None: python-build-standalone on GitHub."
        ),
    )
