# flash-attn wheels for SM120 (RTX PRO 6000 Blackwell), compiled from source.
#
# Driven by roles/wheels (roles/wheels/README.md), which passes every build argument below,
# caps MAX_JOBS/NVCC_THREADS from the builder's memory and cores, and exports the artifact
# stage with `--output type=local`:
#
#   DOCKER_BUILDKIT=1 docker build -f flash-attn.Dockerfile --target artifact \
#       --build-arg FLASH_ATTN_VERSION=2.8.3 --build-arg TORCH_VERSION=2.9.1 \
#       --build-arg MAX_JOBS=1 --build-arg NVCC_THREADS=2 --output type=local,dest=out/ CONTEXT
#
# The build context holds this file, roles/wheels/docker/wheels/ (helpers), torch.lock.txt, extra-ca/
# (CA certificates to trust; may be empty) and, with SOURCE=context, src/ (a source tree to build as given).
# No `# syntax=` line: that would pull a frontend image from a registry.

# The default is roles/shared/wheel_plan.py's CUDA 12.8 image, by digest (a tag can move);
# roles/wheels always passes BASE_IMAGE, pinned the same way.
ARG BASE_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu24.04@sha256:520292dbb4f755fd360766059e62956e9379485d9e073bbd2f6e3c20c270ed66
# "pypi": the pinned sdist from the package index; "context": the tree under src/.
ARG SOURCE=pypi

# ---- toolchain: compilers, Python, ccache, torch (same text in both kernel Dockerfiles so
# ---- that BuildKit shares these layers between them)
FROM ${BASE_IMAGE} AS toolchain
ARG PYTHON_VERSION=3.12
ARG TORCH_VERSION=
ARG PIP_INDEX_URL=https://pypi.org/simple
# A mirror's login is no build argument (those stay in the image's history): roles/wheels passes the
# builder's 0600 netrc as the BuildKit secret pypi-netrc, which the steps that reach the index mount at
# /run/secrets/pypi-netrc (a secret mount is in no layer; absent, pip and fetch_source.py send none).
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_INDEX_URL=${PIP_INDEX_URL} \
    NETRC=/run/secrets/pypi-netrc \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CUDA_HOME=/usr/local/cuda \
    PATH=/opt/build-venv/bin:/usr/lib/ccache:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY extra-ca/ /usr/local/share/ca-certificates/inference-host/
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential ca-certificates ccache git \
       ninja-build patch python3 python3-dev python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && update-ca-certificates >/dev/null
RUN found="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
    && if [ "$found" != "${PYTHON_VERSION}" ]; then \
         echo "the base image's python3 is $found but the stack pins Python ${PYTHON_VERSION};" \
              "use a base image whose python3 is ${PYTHON_VERSION}" >&2; exit 1; fi \
    && python3 -m venv /opt/build-venv
# The build tools from their hashed lock (roles/shared/tool_locks.py) and torch from the stack's
# (torch.lock.txt: its entries and what it requires, roles/shared/wheel_plan.py): a wheel whose
# sha256 is not in them stops the build.
COPY wheels/build-tools.lock.txt torch.lock.txt /opt/
RUN --mount=type=cache,target=/root/.cache/pip,id=inference-host-pip \
    --mount=type=secret,id=pypi-netrc \
    pip install --require-hashes --only-binary :all: -r /opt/build-tools.lock.txt \
    && if [ -n "${TORCH_VERSION}" ]; then \
         pip install --require-hashes --only-binary :all: -r /opt/torch.lock.txt; fi
COPY wheels/ /opt/wheels-tools/

# ---- source: the pinned release from the index, or a tree from the build context
FROM toolchain AS source-pypi
ARG FLASH_ATTN_VERSION=2.8.3
# flash_attn-2.8.3.tar.gz's sha256 (inventory/stack.yml flash_attn_sha256; roles/wheels passes the pin).
ARG FLASH_ATTN_SHA256=1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d
RUN --mount=type=secret,id=pypi-netrc \
    python3 /opt/wheels-tools/fetch_source.py flash-attn "${FLASH_ATTN_VERSION}" /src "${FLASH_ATTN_SHA256}"

FROM toolchain AS source-context
COPY src/ /src/

# ---- build: only SM120, capped parallelism, ccache kept between builds
FROM source-${SOURCE} AS build
ARG MAX_JOBS=1
ARG NVCC_THREADS=2
ARG CUDA_ARCHS=120
# Build from source (never download a prebuilt wheel from GitHub) and only for SM120.
ENV FLASH_ATTENTION_FORCE_BUILD=TRUE \
    FLASH_ATTN_CUDA_ARCHS=${CUDA_ARCHS} \
    MAX_JOBS=${MAX_JOBS} \
    NVCC_THREADS=${NVCC_THREADS} \
    PYTORCH_NVCC="ccache /usr/local/cuda/bin/nvcc" \
    CCACHE_DIR=/root/.ccache \
    CCACHE_MAXSIZE=20G
WORKDIR /src
RUN --mount=type=cache,target=/root/.ccache,id=inference-host-ccache-flash-attn \
    /opt/wheels-tools/compile.sh pip wheel --no-build-isolation --no-deps -v -w /wheels /src

# ---- artifact: the wheels and nothing else (exported with --output type=local)
FROM scratch AS artifact
ARG BASE_IMAGE
ARG SOURCE
ARG PYTHON_VERSION
ARG TORCH_VERSION
ARG FLASH_ATTN_VERSION
ARG CUDA_ARCHS
ARG INPUTS_KEY=
LABEL org.opencontainers.image.title="flash-attn wheels" \
      org.opencontainers.image.description="flash-attn built from source for SM${CUDA_ARCHS}" \
      org.opencontainers.image.version="${FLASH_ATTN_VERSION}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      io.inference-host.wheel.package="flash-attn" \
      io.inference-host.wheel.source="${SOURCE}" \
      io.inference-host.wheel.python="${PYTHON_VERSION}" \
      io.inference-host.wheel.torch="${TORCH_VERSION}" \
      io.inference-host.wheel.cuda-archs="${CUDA_ARCHS}" \
      io.inference-host.wheel.inputs-key="${INPUTS_KEY}"
COPY --from=build /wheels/ /
