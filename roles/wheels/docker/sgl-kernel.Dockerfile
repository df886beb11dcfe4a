# sgl-kernel wheels for SM120 (RTX PRO 6000 Blackwell): sm_120a code only, compiled from source.
#
# Driven by roles/wheels (roles/wheels/README.md), which passes every build argument below,
# caps the parallel compile jobs from the builder's memory and cores, and exports the artifact
# stage with `--output type=local`:
#
#   DOCKER_BUILDKIT=1 docker build -f sgl-kernel.Dockerfile --target artifact \
#       --build-arg SGL_KERNEL_VERSION=0.3.21 --build-arg SGLANG_GIT_REF=v0.5.9 \
#       --build-arg TORCH_VERSION=2.9.1 --build-arg MAX_JOBS=2 \
#       --output type=local,dest=out/ CONTEXT
#
# sgl-kernel publishes wheels only (no sdist): the source is the sgl-kernel/ folder of the
# sglang repository at SGLANG_GIT_REF, checked to carry SGL_KERNEL_VERSION, with the patches of
# roles/wheels/patches/sgl-kernel/ applied (sm_120a only). Its CMake fetches cutlass, flashinfer and
# others from GitHub during the build: the builder needs to reach GitHub.
#
# The build context holds this file, roles/wheels/docker/wheels/ (helpers), patches/ (docker/patches/
# sgl-kernel), torch.lock.txt, extra-ca/ (CA certificates to trust; may be empty) and, with SOURCE=context,
# src/ (a source tree to build as given, without the patches).
# No `# syntax=` line: that would pull a frontend image from a registry.

# The default is roles/shared/wheel_plan.py's CUDA 12.8 image, by digest (a tag can move);
# roles/wheels always passes BASE_IMAGE, pinned the same way.
ARG BASE_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu24.04@sha256:520292dbb4f755fd360766059e62956e9379485d9e073bbd2f6e3c20c270ed66
# "git": sgl-kernel/ of the sglang repository at SGLANG_GIT_REF, patched; "context": src/.
ARG SOURCE=git

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

# ---- source: the pinned release from git (patched), or a tree from the build context
FROM toolchain AS source-git
ARG SGL_KERNEL_VERSION=0.3.21
ARG SGLANG_GIT_REF=v0.5.9
ARG SGLANG_GIT_URL=https://github.com/sgl-project/sglang.git
COPY patches/ /opt/sgl-kernel-patches/
RUN git clone --filter=blob:none --no-checkout "${SGLANG_GIT_URL}" /sglang \
    && git -C /sglang checkout --quiet "${SGLANG_GIT_REF}" \
    && if ! grep -q "^version = \"${SGL_KERNEL_VERSION}\"" /sglang/sgl-kernel/pyproject.toml; then \
         echo "sgl-kernel at ${SGLANG_GIT_REF} is not version ${SGL_KERNEL_VERSION}:" >&2; \
         grep '^version' /sglang/sgl-kernel/pyproject.toml >&2; exit 1; fi \
    && for p in /opt/sgl-kernel-patches/*.patch; do \
         echo "applying $p"; patch -d /sglang -p1 --forward --fuzz=0 <"$p" || exit 1; done \
    && ln -s /sglang/sgl-kernel /src

FROM toolchain AS source-context
COPY src/ /src/

# ---- build: sm_120a only, one nvcc thread per job, capped parallel jobs, ccache kept
FROM source-${SOURCE} AS build
ARG MAX_JOBS=1
# Upstream's default is 32 nvcc threads per job, which OOMs small hosts; the cap is in jobs.
ENV NVCC_THREADS=1 \
    MAX_JOBS=${MAX_JOBS} \
    CMAKE_BUILD_PARALLEL_LEVEL=${MAX_JOBS} \
    SKBUILD_CMAKE_DEFINE="SGL_KERNEL_COMPILE_THREADS=1;ENABLE_BELOW_SM90=OFF" \
    CCACHE_DIR=/root/.ccache \
    CCACHE_MAXSIZE=20G
WORKDIR /src
RUN --mount=type=cache,target=/root/.ccache,id=inference-host-ccache-sgl-kernel \
    /opt/wheels-tools/compile.sh pip wheel --no-build-isolation --no-deps -v -w /wheels /src/

# ---- artifact: the wheels and nothing else (exported with --output type=local)
FROM scratch AS artifact
ARG BASE_IMAGE
ARG SOURCE
ARG PYTHON_VERSION
ARG TORCH_VERSION
ARG SGL_KERNEL_VERSION
ARG SGLANG_GIT_REF
ARG PATCHES_SHA256=
ARG INPUTS_KEY=
LABEL org.opencontainers.image.title="sgl-kernel wheels" \
      org.opencontainers.image.description="sgl-kernel built from source for sm_120a only" \
      org.opencontainers.image.version="${SGL_KERNEL_VERSION}" \
      org.opencontainers.image.revision="${SGLANG_GIT_REF}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      io.inference-host.wheel.package="sgl-kernel" \
      io.inference-host.wheel.source="${SOURCE}" \
      io.inference-host.wheel.python="${PYTHON_VERSION}" \
      io.inference-host.wheel.torch="${TORCH_VERSION}" \
      io.inference-host.wheel.cuda-archs="120a" \
      io.inference-host.wheel.patches-sha256="${PATCHES_SHA256}" \
      io.inference-host.wheel.inputs-key="${INPUTS_KEY}"
COPY --from=build /wheels/ /
