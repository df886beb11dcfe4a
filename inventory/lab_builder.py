"""The kernel wheel builder, rehearsed on this machine's own Docker engine.

    uv run pyinfra -y inventory/lab_builder.py deploy.py

In production the builder is the gpu node and roles/wheels drives its Docker engine. Here
Docker cannot run inside the lab's systemd containers, so the builder host is the local
machine itself (`@lab/local`: the lab connector builds the base image below as pyinfra
connects, then works through pyinfra's @local connector) and its engine is the one the lab
already uses:
the role, its facts, the Dockerfiles, the job cap, cuobjdump and the wheelhouse are the real
ones. What differs, because it cannot exist here, is set below as ordinary settings:

- the base image: NVIDIA's CUDA devel image cannot be pulled (no registry), so the lab's
  Debian 12 image with this machine's CUDA toolkit copied in (lab/cuda_image.py) is used,
  pushed to a real registry on 127.0.0.1 (lab/registry.py) and named there by its digest, as
  production names NVIDIA's;
- the source: flash-attn takes hours and sgl-kernel needs GitHub, so a small real CUDA
  extension (lab/fixtures/tiny_cuda_ext) is built in their place, through the same
  Dockerfiles, arguments and export path; torch is not installed (it does not need it);
- the stack (lab_builder.stack.yml): CUDA and Python of the lab image, not production's.
"""

import os

import lab
from lab.cuda_image import cuda_devel_image
from validation import require_valid_inventory

# Per lab prefix, so that developers sharing this machine keep separate wheelhouses.
_wheelhouse = os.environ.get("INFERENCE_HOST_LAB_WHEELHOUSE", str(lab.STATE_DIR / lab.PREFIX / "wheelhouse"))
_ca_bundle = os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
# Tests point this at other trees (a broken one, to prove a failed compile fails the deploy).
_test_source = os.environ.get("INFERENCE_HOST_LAB_BUILDER_SOURCE", "lab/fixtures/tiny_cuda_ext")

builders = [
    (
        "@lab/local",
        {
            "stack_file": os.environ.get("INFERENCE_HOST_LAB_BUILDER_STACK", "lab_builder.stack.yml"),
            "base_extra_ca_certificates": [_ca_bundle] if os.path.exists(_ca_bundle) else [],
            # A placeholder pin here; the connector puts the pushed digest in as it connects.
            # Tests plant another digest (INFERENCE_HOST_LAB_BUILDER_BASE_IMAGE), kept as named.
            "build_base_image": os.environ.get("INFERENCE_HOST_LAB_BUILDER_BASE_IMAGE")
            or cuda_devel_image(build=False),
            "build_source_overrides": {"flash-attn": _test_source, "sgl-kernel": _test_source},
            "build_with_torch": False,
            # This machine's engine is the lab's own: used as it is, never reconfigured.
            "docker_manage_engine": False,
            "build_wheelhouse_dir": _wheelhouse,
            "build_timeout_minutes": int(os.environ.get("INFERENCE_HOST_LAB_BUILD_TIMEOUT_MIN", "20")),
        },
    ),
]

require_valid_inventory(__file__, globals())
