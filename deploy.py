"""Dispatch: which role runs on which host, by inventory group. No operations of its own.

    uv run pyinfra -y inventory/lab.py deploy.py      # the embedded lab
    uv run pyinfra inventory/prod.py deploy.py        # the real machine

The rebuild is an ordered walk, done by ONE run of the command:

1. the Proxmox node is prepared (IOMMU, vfio, nouveau blacklist, kernel headers, the NVIDIA
   driver built by DKMS, nvidia-uvm at boot, the kernel settings its LXC guests share);
2. it reboots when anything asked for that (proxmox_allow_reboot; otherwise the node stops
   with one message saying what to do, and the same command is run again after the reboot);
3. its guests are created once its driver lists the GPUs (after that reboot), with SSH keys
   for the deploy;
4. the deploy continues inside each guest its node has made and started.

pyinfra plans every host before it runs anything, so what a step finds only after an earlier
step ran (a loaded module, a new guest) cannot be in the same plan: the node's last operation
(continue_in_guests, roles/proxmox_host says why it is built so) runs this command again as a
second and, from a bare node, third pass, which plans with what the first made. A converged
site needs one pass. A guest that is not ready is reported, never an error.

Which role runs on which host, in which order, is one table, roles/composition.py's STEPS,
which this file runs (and the preview, python -m roles.render, runs this file against recording
hosts): roles never import each other, and composition happens there and only there. The node's
operations come first, then a barrier every host passes (guests_ready), so pyinfra runs all of
the nodes' operations before any of the guests' own.
"""

from pyinfra import logger

from roles.composition import Scope, steps_for
from roles.proxmox_host import guest_wait_reason
from roles.shared.host_key_check import refuse_changed
from roles.site import current_host, current_site

refuse_changed()  # a host answered with another SSH key than pinned: stop before anything runs
settings = current_host()
waiting = guest_wait_reason(settings)  # a guest its node has not made (or started) yet
if waiting:
    logger.warning(f"{waiting} (nothing is deployed inside it in this pass)")

scope = Scope(settings, current_site(), waiting)
for step in steps_for(scope):
    step.run(scope)
