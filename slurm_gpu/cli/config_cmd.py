"""`slurm-gpu config ...`: check the configuration and print its reference."""

from collections.abc import Iterable
from pathlib import Path

import click

from slurm_gpu.cli.context import AppContext, pass_app_context
from slurm_gpu.config import (
    Config,
    SettingDoc,
    describe_schema,
    locate_config,
    read_config,
    render_config,
)
from slurm_gpu.credentials import exposures
from slurm_gpu.errors import ConfigError, GpuError
from slurm_gpu.models import GpuDevice, SlotKind
from slurm_gpu.slurm.gpu_order import GpuOrder, slurm_gpu_order
from slurm_gpu.slurm.gres import load_gres_node
from slurm_gpu.slurm.mig_minors import MigMinors, load_mig_minors
from slurm_gpu.slurm.runner import CommandRunner, SlurmCommands
from slurm_gpu.slurm.version import describe_slurm

# Asking Slurm its version must not hold `--version` or `config check` for long.
VERSION_TIMEOUT = 10.0


def slurm_runner(config: Config | None) -> CommandRunner:
    """The runner that asks Slurm its version: [slurm]'s (bin_dir, conf), at most 10 s.

    With no config (`--version` on an unreadable one): Slurm's commands on $PATH. Tests
    replace this function to answer with a `slurm_gpu.testing.FakeRunner`.
    """
    if config is None:
        return SlurmCommands(timeout=VERSION_TIMEOUT)
    slurm = config.slurm
    timeout = min(float(slurm.command_timeout), VERSION_TIMEOUT)
    return SlurmCommands(bin_dir=slurm.bin_dir, timeout=timeout, conf=slurm.conf)


def slurm_release_lines(config: Config | None) -> tuple[str, str | None]:
    """The Slurm this config reaches, one line, and the untested-release warning or None."""
    return describe_slurm(slurm_runner(config))


@click.group("config")
def config_group() -> None:
    """Inspect the slurm-gpu configuration."""


def nvml_devices() -> list[GpuDevice] | None:
    """The GPUs NVML lists here; None where NVML cannot be loaded (a head node).

    Tests replace this function to answer with fixed devices.
    """
    from slurm_gpu.gpu.nvml import NvmlSource  # pynvml only where a GPU check runs

    try:
        source = NvmlSource(gpm=False)
    except GpuError:
        return None
    try:
        return source.devices()
    finally:
        source.close()


def gpu_order_lines(config: Config, node: str) -> tuple[list[str], GpuOrder | None]:
    """Comment lines on how slurmd numbers `node`'s GPUs and MIG slots, and that order.

    The order is None where there is no gres.conf here to check. [node] mig_minors is
    read where it is here (a malformed one is a ConfigError); MIG slots are not numbered
    without it.
    """
    path = Path(config.node.gres_conf)
    if not path.is_file():
        return [f"# gres.conf: {path} is not here: {node}'s GPU numbering not checked"], None
    devices = nvml_devices()
    minors_path = Path(config.node.mig_minors)
    minors: MigMinors | None = load_mig_minors(minors_path) if minors_path.is_file() else None
    order = slurm_gpu_order(load_gres_node(path, node), devices, mig_minors=minors)
    lines = [f"# gres.conf {path}, node {node}: {order.rule}"]
    if devices is None:
        lines.append("#   NVML is not available here: the GPUs themselves were not checked")
    elif not order.gpus and not order.problems:
        lines.append(f"#   no GPU of {node} is declared or detected")
    for gpu in order.gpus:
        slot = gpu.slot
        if slot is not None and slot.kind == SlotKind.MIG:
            lines.append(
                f"#   Slurm GPU {gpu.index} = MIG {slot.mig_profile} {slot.slot_id}"
                f" ({slot.parent_uuid}, GI {slot.gpu_instance_id} CI {slot.compute_instance_id})"
            )
        else:
            lines.append(
                f"#   Slurm GPU {gpu.index} = {gpu.path} {gpu.uuid or '(not bound to a device)'}"
            )
    for share in order.shares:
        lines.append(
            f"#   Slurm GPU {share.index}: {share.count} {share.kind}"
            f" ({share.uuid or 'not bound to a device'}), one is 1/{share.count} of the GPU"
        )
    return lines, order


@config_group.command("check")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Config file to check (default: the one slurm-gpu would use).",
)
@click.option(
    "--node",
    default=None,
    help="The Slurm node whose gres.conf lines to check (default: this host's short name).",
)
@pass_app_context
def check(app: AppContext, config_path: Path | None, node: str | None) -> None:
    """Validate the config file and print the effective configuration as TOML.

    The TOML starts with comments naming the Slurm release [slurm] reaches (or why it
    cannot) and how slurmd numbers this node's GPUs ([node] gres_conf, AutoDetect
    included, against the GPUs NVML lists here). A release slurm-gpu is not tested on
    gets a warning on stderr. Exits 1 with one line per problem (file: key: what is
    wrong) when the config is invalid or the node's GPUs cannot be numbered as slurmd
    numbers them.
    """
    from slurm_gpu.node.daemon import default_node_name

    file = locate_config(config_path or app.config_path, app.env, app.default_path)
    config = read_config(file)
    slurm_line, slurm_warning = slurm_release_lines(config)
    click.echo(f"# {slurm_line}")
    gres_lines, order = gpu_order_lines(config, node or default_node_name())
    click.echo("\n".join(gres_lines))
    click.echo(render_config(config), nl=False)
    if order is not None and order.problems:
        raise ConfigError(list(order.problems))
    warnings = [slurm_warning] if slurm_warning else []
    warnings += exposures(file, config.store.url) if file is not None else []
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"config OK: {file if file is not None else 'defaults'}", err=True)


@config_group.command("reference")
def reference() -> None:
    """Print the reference of every config key (type, default, doc) as Markdown.

    docs/config-reference.md is this command's output.
    """
    click.echo(render_reference(describe_schema()), nl=False)


def render_reference(entries: Iterable[SettingDoc]) -> str:
    """The config reference as Markdown: one section per table, one row per key.

    Args:
        entries: `describe_schema()`, in schema order (a table before its keys).
    """
    lines = [
        "# slurm-gpu configuration reference",
        "",
        "<!-- Generated by `slurm-gpu config reference` from the config schema"
        " (slurm_gpu/config/). Do not edit; regenerate. -->",
        "",
        "Every key of `/etc/slurm-gpu/slurm-gpu.toml` (or of the file named by `--config` or",
        '`$SLURM_GPU_CONFIG`). Unknown keys are errors. Durations are text such as `"90s"`,',
        '`"45m"`, `"2h"`, `"7d"`, `"1h30m"`, or a number of seconds. Check a file with',
        "`slurm-gpu config check --config FILE`; `conf/slurm-gpu.toml` is a commented example.",
    ]
    section, header_written = "", True
    for entry in entries:
        if entry.type in _TABLE_TYPES:
            section = entry.key + (".<name>" if entry.type == "table of tables" else "")
            title = f"[[{section}]]" if entry.type == "array of tables" else f"[{section}]"
            lines += ["", f"## `{title}`", "", _cell(entry.doc)]
            header_written = False
            continue
        if not header_written:
            lines += ["", "| Key | Type | Default | Description |", "|---|---|---|---|"]
            header_written = True
        key = entry.key.removeprefix(section + ".") if section else entry.key
        default = f"`{_cell(entry.default)}`" if entry.default else "(required)"
        lines.append(f"| `{key}` | {_cell(entry.type)} | {default} | {_cell(entry.doc)} |")
    return "\n".join(lines) + "\n"


_TABLE_TYPES = ("table", "array of tables", "table of tables")


def _cell(text: str) -> str:
    """Text that is safe inside one Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")
