"""slurm-gpu's configuration: one TOML file -> frozen dataclasses, every problem at once.

The package owns every section's schema and the loader; the rest of slurm-gpu imports
from here, never the reverse:

- `core`: [cluster], [store], [node], [slurm], [logging], the root `Config`, which file.
- `policy`: [controller], [policy.*], [[quota]], [notify].
- `reports`: [cost], [access], [reports].
- `mailprog`: [mailprog], Slurm's MailProg wrapper.
- `names`: the one rule for a user name (and for other names).
- `_loader`: the generic TOML -> dataclass loader, renderer and reference.

`from slurm_gpu.config import Config, load_config` for the whole configuration; a section
class from its module (`from slurm_gpu.config.reports import CostSettings`).
"""

from slurm_gpu.config._loader import (
    SettingDoc,
    doc,
    parse_settings,
    read_toml,
    render_config,
)
from slurm_gpu.config.core import (
    CONFIG_ENV_VAR,
    CREDENTIALS_GROUP,
    DEFAULT_CONFIG_PATH,
    Config,
    describe_schema,
    load_config,
    locate_config,
    read_config,
    shipping_delay,
)

__all__ = [
    "CONFIG_ENV_VAR",
    "CREDENTIALS_GROUP",
    "DEFAULT_CONFIG_PATH",
    "Config",
    "SettingDoc",
    "describe_schema",
    "doc",
    "load_config",
    "locate_config",
    "parse_settings",
    "read_config",
    "read_toml",
    "render_config",
    "shipping_delay",
]
