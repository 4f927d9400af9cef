"""Whether the store's credentials are kept to root and the slurm-gpu group.

Whoever can read the store's password (in the config's store.url) or a SQLite store's
file can read every user's records directly, past slurm-gpu's privacy rules. On a
cluster the config is root:slurm-gpu 0640, a SQLite store lives in a folder of its own
that is root:slurm-gpu 0750, and users run the setgid `slurm-gpu` command
(wrapper/slurm-gpu.c, installed by scripts/install-user-command). `slurm-gpu config
check` reports what is left open.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from slurm_gpu.config import CREDENTIALS_GROUP
from slurm_gpu.store.urls import url_secrets


def exposures(config_file: Path, store_url: str) -> list[str]:
    """One line per way an arbitrary local user could read the store's credentials."""
    found = []
    has_password, database = url_secrets(store_url)
    if has_password and _readable_by_others(config_file):
        found.append(
            f"{config_file}: store.url carries a password and the file is readable by every"
            f" user; make it root:{CREDENTIALS_GROUP} and mode 0640"
            f" (chgrp {CREDENTIALS_GROUP} {config_file}; chmod 0640 {config_file})"
        )
    if database is not None and database.exists() and _readable_by_others(database):
        found.append(
            f"{database}: the SQLite store is readable by every user; keep it in a folder of"
            f" its own that is root:{CREDENTIALS_GROUP} and mode 0750"
            f" (chgrp {CREDENTIALS_GROUP} {database.parent}; chmod 0750 {database.parent})"
        )
    return found


def _readable_by_others(path: Path) -> bool:
    """Whether a user outside the file's owner and group can read it.

    That needs read on the file and search (x) on every folder above it, by the
    "other" bits: a folder closed to others protects everything in it.
    """
    try:
        if not os.stat(path).st_mode & stat.S_IROTH:
            return False
        for folder in path.resolve().parents:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return False
    except OSError:
        return False
    return True
