"""`App`: every service built from the config in one place, once, on first use."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from slurm_gpu.app import App
from slurm_gpu.config import Config


def sqlite_config(tmp_path: Path) -> Config:
    """The default config with its store in a SQLite file under tmp_path."""
    base = Config()
    store = dataclasses.replace(base.store, url=f"sqlite:///{tmp_path / 'store.db'}")
    cluster = dataclasses.replace(base.cluster, name="alpha")
    return dataclasses.replace(base, store=store, cluster=cluster)


def test_a_config_loader_is_not_called_until_a_service_is_asked_for(tmp_path: Path) -> None:
    """App(loader) reads no config until `config` or a service is first used, then once."""
    loads: list[int] = []

    def load() -> Config:
        loads.append(1)
        return sqlite_config(tmp_path)

    app = App(load)
    before = len(loads)
    app.store.ping()
    assert (0, 1, "alpha") == (before, len(loads), app.config.cluster.name)


def test_each_service_is_built_once(tmp_path: Path) -> None:
    """The store, its control records, the runner and the Slurm client are shared."""
    app = App(sqlite_config(tmp_path))
    assert (True, True, True, True) == (
        app.store is app.store,
        app.control is app.store.control,
        app.runner is app.runner,
        app.slurm is app.slurm,
    )


def test_the_store_keeps_the_config_s_cluster_and_echo_setting(tmp_path: Path) -> None:
    """[cluster] name scopes the store and [store] echo_sql reaches its engine."""
    config = sqlite_config(tmp_path)
    config = dataclasses.replace(config, store=dataclasses.replace(config.store, echo_sql=True))
    store = App(config).store
    assert ("alpha", True) == (store.cluster, bool(store.engine.echo))


def test_closing_disposes_the_store_it_opened(tmp_path: Path) -> None:
    """Leaving `with App(...)` disposes the store's pool (a fresh pool replaces it)."""
    with App(sqlite_config(tmp_path)) as app:
        app.store.ping()
        pool = app.store.engine.pool
    assert pool is not app.store.engine.pool


def test_closing_an_app_that_opened_nothing_opens_nothing(tmp_path: Path) -> None:
    """close() on an App whose store was never asked for builds no store (nor config)."""

    def no_config() -> Config:
        raise AssertionError("the config was read")

    app = App(no_config)
    app.close()
    assert "store" not in vars(app)
