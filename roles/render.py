"""Preview what the deploy would write, like `helm template`, contacting no host:

    uv run python -m roles.render INVENTORY --out DIR

For every host of the inventory, each file the deploy templates is written under
DIR/<host>/<path on the host>: the engine unit, environment file, launcher and scripts of the
active stack, the API-key --config file and Hugging Face token with their values replaced by
***, sysctl, limits, profile, apt pin, modprobe/modules and GRUB files; the NVIDIA driver's files
wherever the deploy installs the driver (a Proxmox node whose LXC guests have GPUs included: apt
pin, CUDA apt source, nvidia-uvm module and unit); the weights' unit, config and tool on the host
that downloads them (the node, for an LXC guest's mounted directory), with its Hugging Face token
masked; kernel settings an LXC guest shares with its node on the node; for a Proxmox node, the
`pct create` / `qm create` (and `pct set` / `qm set`) command line of each of its guests under
DIR/<node>/inference-host-commands/. DIR/<host>/inference-host-preview.txt lists what only
the host itself can decide (facts the deploy reads there). Secrets are never decrypted: no
vault password is needed, and no secret value can reach DIR.

The inventory is validated first (same messages and checks as the deploy's hook,
validation.py); exit 2 on problems. Which roles a host gets is the deploy's own table
(roles/composition.py), which deploy.py runs; this module reads each role's template arguments
from the role itself, and no role imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import validation
from roles import composition
from roles.shared import layout, pve, templates
from roles.shared.shell import argv, comment, word
from roles.site import (
    PROJECT_ROOT,
    HostSettings,
    Site,
    SiteError,
    engine_reads_hub_token,
    load_site,
    node_sysctl,
    own_sysctl,
    weight_sets_kept_by,
)
from roles.site.command_line import OneLineParser
from roles.site.errors import output_path_problem, print_problems

MASK = "***"


class Preview:
    def __init__(self, out: Path, host: str):
        self.root = out / host
        self.notes: list[str] = []
        self.written: list[Path] = []

    def file(self, path: str, text: str) -> None:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        self.written.append(target)

    def template(self, path: str, template: str, **kwargs) -> None:
        self.file(path, templates.render(template, **kwargs))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def finish(self) -> None:
        if self.notes:
            self.file(
                "inference-host-preview.txt",
                "What only the host can decide (read there at deploy time):\n"
                + "".join(f"- {n}\n" for n in self.notes),
            )


def _base(p: Preview, settings: HostSettings, site: Site) -> None:
    from roles import base

    sysctl = own_sysctl(settings)
    if sysctl:
        p.template(base.SYSCTL_FILE, "roles/base/templates/90-inference-host-sysctl.conf.j2", sysctl=sysctl)
    left = sorted(set(settings.base.sysctl) - set(sysctl))
    if left:
        p.note(
            f"base_sysctl {', '.join(left)}: the shared kernel's, written on node {settings.guest.node}"
            f" ({base.SYSCTL_FILE} is removed here)"
        )
    p.template(
        base.LIMITS_FILE,
        "roles/base/templates/90-inference-host-limits.conf.j2",
        service_user=settings.base.service_user,
        nofile=settings.base.limit_nofile,
        memlock=settings.base.limit_memlock,
    )
    if engine_reads_hub_token(settings, site.hosts):
        p.file(f"{settings.base.data_dir}/.cache/huggingface/token", MASK)
    _pypi_netrc(p, settings)


def _pypi_netrc(p: Preview, settings: HostSettings) -> None:
    """The PyPI mirror's netrc (0600 root), its login and password masked: written on every host
    that runs uv or pip for the deploy (gpu nodes, gateways, builders, monitors)."""
    from roles.shared import mirror_auth

    if settings.base.pypi_index_credentials_secret and settings.base.pypi_index_url:
        p.file(mirror_auth.PYPI_NETRC, mirror_auth.netrc_text(settings.base.pypi_index_url, MASK, MASK))
        p.note(
            f"{mirror_auth.PYPI_NETRC}: mode 0600 root, the login of base_pypi_index_credentials_secret"
            " (uv and pip find it through NETRC; the kernel-wheel builds as the BuildKit secret"
            f" {mirror_auth.BUILD_SECRET_ID})"
        )


def _cuda(p: Preview, settings: HostSettings, site: Site) -> None:
    from roles import cuda

    version = site.stack.active.cuda
    p.template(
        cuda.PROFILE_FILE,
        "roles/cuda/templates/90-inference-host-cuda.sh.j2",
        cuda_home=word(cuda.toolkit_dir(version)),
        version=comment(version),
    )


def _nvidia_driver(p: Preview, settings: HostSettings, site: Site) -> None:
    from roles import nvidia_driver
    from roles.shared import nvidia_repo

    version = site.stack.driver_version
    node = settings.in_group("proxmox_hosts")
    p.template(
        nvidia_driver.PIN_FILE, "roles/nvidia_driver/templates/90-inference-host-nvidia-driver.j2", version=version
    )
    if settings.cuda.repo_credentials_secret:
        from roles.shared import mirror_auth

        p.file(mirror_auth.CUDA_AUTH_FILE, mirror_auth.apt_auth_text(settings.cuda.repo_url, MASK, MASK))
        p.note(
            f"{mirror_auth.CUDA_AUTH_FILE}: mode 0600 root, the login of cuda_repo_credentials_secret"
            " (apt and apt-helper read it; the apt source's URL has none)"
        )
    if node:  # Proxmox VE 8 is Debian 12 (roles/proxmox_host refuses anything else)
        distro = nvidia_repo.SUPPORTED[("Debian", 12, None)]
        p.file(nvidia_repo.cuda_sources_file(distro), nvidia_repo.cuda_sources_line(settings, distro) + "\n")
    else:
        p.note(
            f"NVIDIA's CUDA apt source: {nvidia_repo.cuda_repo_url(settings, nvidia_repo.SUPPORTED[('Ubuntu', 24, 4)])}"
            " (ubuntu2404) or its debian12 path, as the host's distro says"
        )
    if settings.driver_mode != "full":
        p.note(
            f"{nvidia_driver.PIN_FILE}: an LXC guest follows its node's loaded module version,"
            f" shown here as stack.yml's pin {version}"
        )
        return
    if not node:  # a node's blacklist is roles/proxmox_host's
        p.template(nvidia_driver.NOUVEAU_BLACKLIST, "roles/nvidia_driver/templates/blacklist-nouveau.conf.j2")
    # The module at boot: on a node (its kernel) and on a VM or bare metal (inside a container,
    # the deploy finds no kernel of its own there and leaves these out).
    p.file(nvidia_driver.UVM_MODULES_FILE, nvidia_driver.UVM_MODULES_TEXT)
    p.template(
        f"{layout.SYSTEMD_DIR}/{nvidia_driver.UVM_UNIT}", f"roles/nvidia_driver/templates/{nvidia_driver.UVM_UNIT}.j2"
    )


def _weights(p: Preview, settings: HostSettings, site: Site) -> None:
    from roles import weights

    kept = weight_sets_kept_by(site, settings.name)
    if not kept:
        return
    p.file(weights.TOOL, (PROJECT_ROOT / "roles/weights/files/inference-host-weights").read_text())
    for secret in sorted({ws.token_secret for ws in kept if ws.token_secret}):
        p.file(weights.token_file(secret), MASK)
    for ws in kept:
        p.file(f"{weights.CONFIG_DIR}/{ws.name}.json", weights.config_text(ws))
        p.template(
            layout.unit_file(weights.unit_name(ws)),
            "roles/weights/templates/inference-host-weights.service.j2",
            **weights.unit_kwargs(ws),
        )
    p.note(
        f"huggingface_hub {weights.HF_HUB_VERSION} and hf_xet {weights.HF_XET_VERSION} are installed into"
        f" {weights.ENV_DIR} (pip --require-hashes of {weights.ENV_LOCK}) unless its pins file says so;"
        " each download starts when its directory is"
        " not a verified copy of the pinned commit"
    )


def _serving(p: Preview, settings: HostSettings, site: Site) -> None:
    from roles import serving

    stack = site.stack.active
    for path, template, _, kwargs in serving.release_templates(settings, stack, site):
        p.template(path, template, **kwargs)
    for path, content in serving.key_previews(settings, stack, site, MASK):
        p.file(path, content)
    for name in serving.SCRIPTS:
        p.template(f"{serving.LIBEXEC}/{name}", f"roles/serving/templates/{name}.j2")
    p.file(serving.PREFLIGHT_SCRIPT, serving.PREFLIGHT_SOURCE.read_text())
    command = serving.preflight_command(settings, stack, site)
    if command:
        p.file(
            "inference-host-commands/engine-preflight.sh",
            f"# before a switch: {stack.label}'s own start-up checks of the rendered command line\n{command}\n",
        )
    name = settings.serving.unit_name
    p.note(
        f"{layout.unit_file(name)} and {layout.secret_args_link(name)} are links through"
        f" {layout.current_link(settings.base.install_root)}"
        f" to the files of stack {stack.id} above"
    )


def _proxmox_host(p: Preview, settings: HostSettings, site: Site) -> None:
    from roles import proxmox_host as node

    p.template(node.MODULES_FILE, "roles/proxmox_host/templates/vfio.conf.j2", modules=node.VFIO_MODULES)
    p.template(node.BLACKLIST_FILE, "roles/proxmox_host/templates/blacklist-nouveau.conf.j2")
    sysctl = node_sysctl(settings, site.hosts)
    if sysctl:
        p.template(node.SYSCTL_FILE, "roles/proxmox_host/templates/90-inference-host-node.conf.j2", sysctl=sysctl)
    vendor, loader = settings.proxmox.cpu_vendor, settings.proxmox.boot_loader
    if vendor == "auto" or loader == "auto":
        p.note(f"IOMMU kernel arguments: CPU vendor {vendor!r}, boot loader {loader!r} are read on the node")
    if vendor != "auto" and loader == "grub":
        p.template(
            node.GRUB_DROPIN,
            "roles/proxmox_host/templates/inference-host-iommu.cfg.j2",
            kernel_args=node.iommu_kernel_args(vendor),
        )
    elif vendor != "auto" and loader == "systemd-boot":
        p.note(f"{node.SYSTEMD_BOOT_CMDLINE}: the node's own line plus {' '.join(node.iommu_kernel_args(vendor))}")
    for guest in site.hosts.values():
        if guest.valid("guest") and guest.guest.node == settings.name:
            _guest_commands(p, settings, guest)


def _guest_commands(p: Preview, node: HostSettings, guest: HostSettings) -> None:
    vmid, folder = guest.guest.vmid, "inference-host-commands"
    assert vmid is not None  # a guest has one (the site model requires guest_vmid)
    if guest.in_group("lxc_guests"):
        empty = pve.parse_config("", "lxc")
        from roles import lxc_guest

        # The deploy reads each GPU's minor on the node; shown here in proxmox_gpu_addresses order.
        minors = [node.proxmox.gpu_addresses.index(a) for a in guest.guest.gpu_addresses]
        devices = pve.lxc_device_paths(minors, {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"})
        plan = lxc_guest.plan_update(guest, empty, devices)
        create, tool = lxc_guest.create_command(guest, devices), "pct"
        p.note(
            f"CT {vmid}: /dev/nvidiaN minors are read on the node (shown in proxmox_gpu_addresses"
            " order); /dev/nvidia-modeset and /dev/nvidia-caps/* are added when the node has them"
        )
    else:
        from roles import kvm_guest

        empty = pve.parse_config("", "qemu")
        plan = kvm_guest.plan_update(guest, empty)
        create, tool = kvm_guest.create_command(guest), "qm"
    update = argv(tool, "set", vmid, *plan.arguments())
    p.file(f"{folder}/{tool}-create-{vmid}.sh", f"# {guest.name}: when guest {vmid} does not exist\n{create}\n")
    p.file(
        f"{folder}/{tool}-set-{vmid}.sh",
        f"# {guest.name}: on an existing guest the deploy sets only what differs from this\n{update}\n",
    )


def _gateway(p: Preview, settings: HostSettings, site: Site) -> None:
    from roles import gateway

    for path, template, _, kwargs in gateway.templates(settings, site.hosts):
        p.template(path, template, **kwargs)
    if gateway.api_key_secret(site.hosts):
        p.file(gateway.API_KEY_FILE, MASK)
    if settings.gateway.control_plane_api_key_secret:
        p.file(gateway.GATEWAY_CONTROL_PLANE_KEY_FILE, MASK)
    if gateway.tenant_api_key_secrets(site.hosts):
        p.file(gateway.TENANT_KEYS_FILE, MASK)
    p.note(
        f"smg {settings.gateway.version} is installed exactly from its lock into"
        f" {gateway.env_path(site, settings)} unless it is there"
    )


def _firewall(p: Preview, settings: HostSettings, site: Site) -> None:
    from roles import firewall
    from roles.firewall import ruleset

    p.file(ruleset.CONF_FILE, ruleset.ruleset(settings, site))
    p.file(firewall.DROPIN, firewall.DROPIN_TEXT)


def _monitoring(p: Preview, settings: HostSettings, site: Site) -> None:
    from roles.monitoring import config, units

    if not settings.in_group("gpu_nodes"):  # a gpu node's node_exporter is previewed with its roles
        path, template, kwargs = units.node_exporter_template(settings, site)
        p.template(path, template, **kwargs)
    for path, template, kwargs in units.monitor_templates(settings):
        p.template(path, template, **kwargs)
    hashed = MASK if settings.monitoring.web_password_secret else None
    for path, text in config.files(site, settings, hashed).items():
        p.file(path, text)
    p.note(f"{config.WEB_CONFIG_FILE}: the bcrypt hash of monitoring_web_password_secret is made at deploy time")
    if config.relay_receivers(settings):
        path, template, kwargs = units.relay_template(settings)
        p.template(path, template, **kwargs)
        names = ", ".join(config.relay_receivers(settings))
        p.note(f"{config.RELAY_CONFIG}: the alert relay's URLs for {names}, from the vault at deploy time (0600)")


def _monitoring_gpu(p: Preview, settings: HostSettings, site: Site) -> None:
    from roles.monitoring import checks_env, units

    if not site.group("monitors"):
        return  # as the deploy: no monitor, no exporters (roles.monitoring.watched)
    path, template, kwargs = units.node_exporter_template(settings, site)
    p.template(path, template, **kwargs)
    if settings.monitoring.dcgm_exporter:
        p.file(*units.dcgm_dropin(settings, site))
    requirements = checks_env.requirements((PROJECT_ROOT / "uv.lock").read_text())
    bundle = units.bundle_dir(checks_env.bundle_digest())
    for path, template, kwargs in units.gpu_templates(settings, bundle, f"{units.env_dir(requirements)}/bin/python"):
        p.template(path, template, **kwargs)
    p.file(units.EXPECT_FILE, units.expect_text(settings, site))
    p.file(f"{units.env_dir(requirements)}.requirements.txt", requirements)
    p.note(f"{bundle}: a copy of {len(checks_env.bundle_files())} files of the checks (checks, roles/site)")


def _monitoring_role(p: Preview, settings: HostSettings, site: Site) -> None:
    _pypi_netrc(p, settings)  # a monitor that runs no base role installs with uv too
    if settings.in_group("gpu_nodes"):
        _monitoring_gpu(p, settings, site)
    if settings.in_group("monitors"):
        _monitoring(p, settings, site)


def _not_previewed(why: str) -> Callable[[Preview, HostSettings, Site], None]:
    """A role whose files the preview does not show yet: said in the host's notes, not omitted
    silently."""
    return lambda p, settings, site: p.note(f"not previewed: {why}")


# Each role of the table (roles/composition.py's STEPS) -> its preview; a role the table runs
# that is not here is an error (tests/unit/test_composition.py; render raises KeyError).
PREVIEWS: dict[str, Callable[[Preview, HostSettings, Site], None] | None] = {
    "proxmox_host": _proxmox_host,
    "lxc_guest": None,  # writes no file: its pct commands are under the node's (_proxmox_host)
    "kvm_guest": None,  # as lxc_guest, with qm
    "base": _base,
    "firewall": _firewall,
    "nvidia_driver": _nvidia_driver,
    "cuda": _cuda,
    "weights": _weights,
    "serving": _serving,
    "gateway": _gateway,
    "monitoring": _monitoring_role,
    "health": None,  # writes no file: it runs the checks and reads their verdict
    "docker_engine": _not_previewed(
        "roles/docker_engine's apt sources and /etc/docker/daemon.json (data-root, logs) are made by the role"
    ),
    "wheels": _not_previewed("roles/wheels uploads its build script, contexts and inputs to the builder"),
    "engine_envs": _not_previewed("roles/engine_envs uploads each stack's lock and patches to the gpu node"),
    "eagle3_training": _not_previewed(
        "roles/eagle3_training's job config, wrapper, units and polkit rule (it is laid down, never started)"
    ),
}


def render(site: Site, out: Path) -> dict[str, list[Path]]:
    written = {}
    for name, settings in site.hosts.items():
        p = Preview(out, name)
        for role in composition.roles_for(composition.Scope(settings, site)):
            preview = PREVIEWS[role]
            if preview is not None:
                preview(p, settings, site)
        p.finish()
        written[name] = p.written
    return written


def engine_diff(site: Site, other_id: str, model_dir: Path, draft_dir: Path | None, python: str | None) -> str:
    """Each gpu node's engine settings as the engine itself resolves them, on the active stack
    and on other_id, side by side (roles/serving/preflight.py runs the engines' own code)."""
    from roles.serving import preflight

    if other_id not in site.stack.stacks:
        raise SiteError(
            [f"--engine-diff {other_id}: no such stack in {site.stack.file}; stacks: {', '.join(site.stack.stacks)}"]
        )
    if not (model_dir / "config.json").is_file():
        raise SiteError(
            [
                f"--model-dir {model_dir}: no config.json there; give a folder with the model's"
                " config files (the Hub repository's *.json and *.py, no weights)"
            ]
        )
    nodes = [(site, settings) for settings in site.group("gpu_nodes")]
    before = preflight.run_many(site.stack.active, nodes, model_dir, draft_dir, python)
    after = preflight.run_many(site.stack.stacks[other_id], nodes, model_dir, draft_dir, python)
    return "\n".join(preflight.diff_text(old, new) for old, new in zip(before, after, strict=True))


def main(argv: list[str] | None = None, prog: str = "python -m roles.render") -> int:
    parser = OneLineParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("inventory", help="inventory file, e.g. inventory/prod.py")
    parser.add_argument("--out", type=Path, help="folder for DIR/<host>/<path on the host>")
    parser.add_argument(
        "--engine-diff",
        metavar="STACK",
        help="show each gpu node's engine settings, resolved by the engine's own start-up code,"
        " on the active stack and on STACK (installs both stacks' locks on this machine)",
    )
    parser.add_argument(
        "--model-dir", type=Path, help="with --engine-diff: the model's config files (config.json, configuration_*.py)"
    )
    parser.add_argument("--draft-model-dir", type=Path, help="with --engine-diff: the EAGLE-3 drafter's config.json")
    parser.add_argument("--python", help="with --engine-diff: the CPython of the stacks' version to install with")
    args = parser.parse_args(argv)
    if not args.out and not args.engine_diff:
        parser.error("give --out DIR (the files) or --engine-diff STACK (the engine's settings)")
    if args.engine_diff and not args.model_dir:
        parser.error("--engine-diff needs --model-dir (the model's config files)")
    try:
        site = load_site(args.inventory, validation.ROLE_CHECKS)  # the deploy's hook's checks
        if args.out:
            problem = output_path_problem("--out", args.out, folder=True)
            if problem:
                raise SiteError([problem])
        if args.engine_diff:
            print(engine_diff(site, args.engine_diff, args.model_dir, args.draft_model_dir, args.python), end="")
    except SiteError as error:
        print_problems(error)
        return 2
    if args.out:
        for host, paths in render(site, args.out).items():
            print(f"{host}: {len(paths)} file(s) under {args.out / host}")
    return 0


if __name__ == "__main__":
    from roles.site.command_line import run_command

    run_command(main, "python -m roles.render")
