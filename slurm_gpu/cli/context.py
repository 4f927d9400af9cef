"""What every command shares: the --config choice, the config and the `App`, loaded on use.

`ctx.obj` is an `AppContext`. A command that needs services takes the `App` with
`@pass_app`; one that handles the config file itself takes the AppContext with
`@pass_app_context`. Nothing is read from disk until a command asks for the config or a
service, so `slurm-gpu --help`, `--version` and every `--help` work with a broken config
file.

This is also where commands for administrators are refused to everyone else, in one
place: a command under `ADMIN_COMMANDS` gets its App only once the caller (the real uid)
is known to be an admin, so no store, not even one given with `--url` that the user could
write, is opened for anyone else (slurm_gpu/access.py says who is an admin).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

import click

from slurm_gpu.access import Caller
from slurm_gpu.app import App
from slurm_gpu.config import DEFAULT_CONFIG_PATH, Config, load_config

P = ParamSpec("P")
R = TypeVar("R")

# Commands that change records or act through Slurm: administrators only.
ADMIN_COMMANDS = frozenset({"controller", "db", "exempt", "sync"})


@dataclass
class AppContext:
    """Per-invocation state, stored on click's `ctx.obj`.

    Attributes:
        config_path: the --config file, or None for $SLURM_GPU_CONFIG / the default.
        env: environment used to find the config (None: os.environ); tests inject one.
        default_path: the config file used when none is named; tests inject one.
        caller: who runs the command (None: the process's real uid); tests inject one.
    """

    config_path: Path | None = None
    env: Mapping[str, str] | None = None
    default_path: Path = DEFAULT_CONFIG_PATH
    caller: Caller | None = None
    _config: Config | None = field(default=None, repr=False)
    _app: App | None = field(default=None, repr=False)

    @property
    def config(self) -> Config:
        """The effective configuration, loaded once on first access.

        Raises:
            ConfigError: the config file is missing (when named), unreadable or invalid.
        """
        if self._config is None:
            self._config = load_config(self.config_path, self.env, self.default_path)
        return self._config

    def app(self, ctx: click.Context) -> App:
        """The App of this invocation; it loads `config` when first asked for a service.

        It is closed (the store's connections released) when the outermost click
        context ends, through `ctx.with_resource`.

        Raises:
            NotAnAdmin: `ctx` runs one of `ADMIN_COMMANDS` and the caller is no admin.
        """
        if self._app is None:
            app = App(lambda: self.config, caller=self.caller)
            self._app = ctx.find_root().with_resource(app)
        command = top_command(ctx)
        if command in ADMIN_COMMANDS:
            self._app.require_admin(command)
        return self._app


def top_command(ctx: click.Context) -> str:
    """The name of the command under `slurm-gpu` that `ctx` runs ("db" for `db upgrade`)."""
    while ctx.parent is not None and ctx.parent.parent is not None:
        ctx = ctx.parent
    return ctx.info_name or ""


def pass_app(command: Callable[Concatenate[App, P], R]) -> Callable[P, R]:
    """Decorator giving a command this invocation's `App` as its first argument."""

    @functools.wraps(command)
    def with_app(*args: P.args, **kwargs: P.kwargs) -> R:
        ctx = click.get_current_context()
        return command(ctx.ensure_object(AppContext).app(ctx), *args, **kwargs)

    return with_app


pass_app_context = click.make_pass_decorator(AppContext, ensure=True)
"""Decorator giving a command the AppContext (the --config choice) as its first argument."""
