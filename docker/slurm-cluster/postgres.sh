# shellcheck shell=bash
# PostgreSQL for the test bed: slurm-gpu's accounting store on a real PostgreSQL server.
#
# Sourced by lib.sh, which defines STATE, log, die, spawn, wait_for and is_running.
# Everything lives under $STATE:
#   pgdata/   the cluster (initdb'd once, owned by postgres)
#   pg-run/   its Unix socket directory       log/postgres.out   its log
# It listens on 127.0.0.1:${SLURM_GPU_PG_PORT:-15432} only. Role `slurmgpu` (CREATEDB, so
# the store tests may create `slurm_gpu_test_*` databases) owns database `slurm_gpu`:
#   postgresql+psycopg://slurmgpu:slurmgpu-testbed@127.0.0.1:15432/slurm_gpu
#
# Debian's /usr/local/bin/pg_ctl may be a wrapper, so the binaries are named explicitly.

PG_BIN=${SLURM_GPU_PG_BIN:-/usr/lib/postgresql/15/bin}
PG_PORT=${SLURM_GPU_PG_PORT:-15432}
PG_ADDR=${SLURM_GPU_PG_ADDR:-127.0.0.1}
# Test-bed-only credentials (loopback only); the same password as the MariaDB store user.
PG_STORE_PASS=${DB_STORE_PASS:-slurmgpu-testbed}

# pg_psql ARGS...: psql as the postgres superuser over the Unix socket (peer auth).
# shellcheck disable=SC2120 # the test bed only feeds it stdin; ARGS are for use by hand.
pg_psql() {
    runuser -u postgres -- "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$STATE/pg-run" \
        -p "$PG_PORT" -d postgres "$@"
}

pg_ready() {
    "$PG_BIN/pg_isready" -q -h "$STATE/pg-run" -p "$PG_PORT" -d postgres
}

start_postgres() {
    mkdir -p "$STATE/run" "$STATE/log" "$STATE/pg-run"
    chown postgres:postgres "$STATE/pg-run"
    if ! is_running postgres; then
        [ -x "$PG_BIN/postgres" ] || die "PostgreSQL 15 not found in $PG_BIN (apt-get install postgresql)"
        if [ ! -f "$STATE/pgdata/PG_VERSION" ]; then
            mkdir -p "$STATE/pgdata"
            chown postgres:postgres "$STATE/pgdata"
            chmod 700 "$STATE/pgdata"
            # Local (socket) connections as the OS user postgres; TCP needs a password.
            runuser -u postgres -- "$PG_BIN/initdb" -D "$STATE/pgdata" -U postgres -E UTF8 \
                --no-locale --auth-local=peer --auth-host=scram-sha-256 \
                >"$STATE/log/postgres-initdb.log" 2>&1 ||
                die "initdb failed: $STATE/log/postgres-initdb.log"
        fi
        # The log file is opened by spawn (as root) before postgres drops to its user.
        spawn postgres runuser -u postgres -- "$PG_BIN/postgres" -D "$STATE/pgdata" \
            -k "$STATE/pg-run" -h "$PG_ADDR" -p "$PG_PORT"
    fi
    wait_for postgres 60 pg_ready
    # Idempotent: the role is (re)set to the expected password; the database is created once.
    pg_psql <<SQL
DO \$\$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'slurmgpu') THEN
        CREATE ROLE slurmgpu LOGIN CREATEDB PASSWORD '$PG_STORE_PASS';
    ELSE
        ALTER ROLE slurmgpu LOGIN CREATEDB PASSWORD '$PG_STORE_PASS';
    END IF;
END
\$\$;
SELECT 'CREATE DATABASE slurm_gpu OWNER slurmgpu'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'slurm_gpu') \gexec
SQL
}

# stop_postgres: a fast shutdown (disconnects clients) rather than the smart shutdown that
# SIGTERM asks for, which waits for every pooled connection to close.
stop_postgres() {
    local pf="$STATE/run/postgres.pid"
    if [ -f "$STATE/pgdata/postmaster.pid" ]; then
        runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$STATE/pgdata" -m fast -w -t 30 stop \
            >/dev/null 2>&1 || true
    fi
    rm -f "$pf"
}
