# Lab only: stands in for nvidia/cuda:<version>-devel-ubuntu24.04, which no registry serves here.
# It carries the real CUDA toolkit of the machine running the lab (nvcc, ptxas, headers,
# cudart), copied in by lab/cuda_image.py; the build context is that toolkit's folder.
# The kernel wheel Dockerfiles take it through their BASE_IMAGE build argument.
ARG BASE=inference-host/lab-base:debian12
FROM ${BASE}
ARG CUDA_DIR_NAME=cuda
COPY . /usr/local/${CUDA_DIR_NAME}/
RUN [ -e /usr/local/cuda ] || ln -s ${CUDA_DIR_NAME} /usr/local/cuda
ENV PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CUDA_HOME=/usr/local/cuda
