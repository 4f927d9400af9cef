"""Store URLs: the driver a bare URL gets, and what of a URL may be shown or is secret."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

# A bare `postgresql://` or `mysql://` URL gets the driver slurm-gpu ships with.
DEFAULT_DRIVERS = {"postgresql": "psycopg", "mysql": "pymysql", "mariadb": "pymysql"}
# The pip extra of slurm-gpu that installs each backend's driver.
EXTRAS = {"postgresql": "postgresql", "mysql": "mariadb", "mariadb": "mariadb"}


def describe_url(url: sa.URL) -> str:
    """`backend://host:port/database` of a URL: what error messages show (no user/password)."""
    if url.get_backend_name() == "sqlite":
        return f"sqlite:///{url.database or ':memory:'}"
    host = url.host or "localhost"
    port = f":{url.port}" if url.port else ""
    return f"{url.get_backend_name()}://{host}{port}/{url.database or ''}"


def url_secrets(url: str) -> tuple[bool, Path | None]:
    """What of a store URL gives access to the data.

    Returns:
        Whether it carries a password, and its SQLite database file (None: another
        backend, in memory, or not a valid URL).
    """
    try:
        parsed = sa.make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        return False, None
    database = parsed.database
    is_file = parsed.get_backend_name() == "sqlite" and bool(database) and database != ":memory:"
    return bool(parsed.password), Path(database) if is_file and database else None
