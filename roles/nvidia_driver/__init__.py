"""roles/nvidia_driver: the NVIDIA driver with the open kernel modules, pinned and held.

- role.py: the deploy (`from roles.nvidia_driver.role import nvidia_driver`), pyinfra.
- facts.py: pyinfra facts over driver_state's parsers.
- driver_state.py: the parsers of the driver's evidence, standard library only; also a
  read-only command-line check (`python3 roles/nvidia_driver/driver_state.py`).

This file imports nothing on purpose: importing roles.nvidia_driver.driver_state runs it first,
and the health checks (roles/gpu_parsers.py, tests/infra) import driver_state on GPU machines
that have no pyinfra.
"""
