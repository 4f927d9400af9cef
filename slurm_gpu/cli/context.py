"""What every command shares: the --config choice, and the config loaded on first use.

Command modules take it with `@pass_app`; nothing is read from disk until a command asks
for `app.config`, so `slurm-gpu --help` and `--version` work with a broken config file.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import click

from slurm_gpu.config import DEFAULT_CONFIG_PATH, Config, load_config


@dataclass
class AppContext:
    """Per-invocation state, stored on click's `ctx.obj`.

    Attributes:
        config_path: the --config file, or None for $SLURM_GPU_CONFIG / the default.
        env: environment used to find the config (None: os.environ); tests inject one.
        default_path: the config file used when none is named; tests inject one.
    """

    config_path: Path | None = None
    env: Mapping[str, str] | None = None
    default_path: Path = DEFAULT_CONFIG_PATH
    _config: Config | None = field(default=None, repr=False)

    @property
    def config(self) -> Config:
        """The effective configuration, loaded once on first access.

        Raises:
            ConfigError: the config file is missing (when named), unreadable or invalid.
        """
        if self._config is None:
            self._config = load_config(self.config_path, self.env, self.default_path)
        return self._config


pass_app = click.make_pass_decorator(AppContext, ensure=True)
"""Decorator giving a command the AppContext as its first argument."""
