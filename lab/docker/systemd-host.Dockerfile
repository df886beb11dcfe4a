# A rehearsal host: systemd as PID 1, for the lab's stand-in guests (lab/__init__.py).
# BASE is a locally made Debian 12 image (debootstrap + docker import) or ubuntu:24.04.
ARG BASE=ubuntu:24.04
FROM ${BASE}

# The debootstrap image already has these; ubuntu:24.04 from a registry does not.
RUN if [ ! -x /lib/systemd/systemd ] || ! command -v python3 >/dev/null; then \
        apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
           systemd systemd-sysv dbus python3 procps iproute2 \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    # Units that make no sense in a container and would only degrade the boot.
    && for unit in systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
                   getty.target console-getty.service systemd-remount-fs.service; do \
        ln -sf /dev/null /etc/systemd/system/$unit; \
    done

ENV container=docker
STOPSIGNAL SIGRTMIN+3
CMD ["/sbin/init"]
