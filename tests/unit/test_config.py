"""slurm_gpu.config and slurm_gpu.durations: loading, validation, rendering, reference."""

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from slurm_gpu.config import (
    CONFIG_ENV_VAR,
    Config,
    describe_schema,
    doc,
    load_config,
    locate_config,
    parse_settings,
    read_config,
    render_config,
)
from slurm_gpu.config.core import NodeSettings, StoreSettings
from slurm_gpu.durations import Duration, format_duration, parse_duration
from slurm_gpu.errors import ConfigError
from tests.toml_keys import commented_examples, leaf_keys

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "conf" / "slurm-gpu.toml"
CONFIGS = REPO / "tests" / "data" / "configs"


def write(tmp_path: Path, text: str, name: str = "slurm-gpu.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    return caught.value.problems


# ---------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", 90.0),
        ("45m", 2700.0),
        ("2h", 7200.0),
        ("7d", 604800.0),
        ("1h30m", 5400.0),
        ("1d2h3m4s", 93784.0),
        ("1h 30m", 5400.0),
        ("1.5h", 5400.0),
        ("0.25s", 0.25),
        ("30", 30.0),
        ("2.5", 2.5),
        (" 10s ", 10.0),
        (0, 0.0),
        (600, 600.0),
        (1.5, 1.5),
    ],
)
def test_parse_duration_accepts(text: str | float, expected: float) -> None:
    """Every documented duration form parses to the number of seconds it names."""
    assert expected == parse_duration(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty duration"),
        ("ten", "not a duration"),
        ("10 seconds", "unknown unit 'seconds'"),
        ("5w", "unknown unit 'w'"),
        ("30m1h", "out of order"),
        ("1h1h", "out of order"),
        ("-5s", "must not be negative"),
        ("-5", "must not be negative"),
        (-1, "must not be negative"),
        ("inf", "must be finite"),
        ("h", "not a duration"),
    ],
)
def test_parse_duration_rejects(text: str | float, message: str) -> None:
    """Malformed, negative and infinite durations raise ValueError saying why."""
    with pytest.raises(ValueError, match=message):
        parse_duration(text)


def test_parse_duration_rejects_bool() -> None:
    """true is not a duration even though Python treats it as 1."""
    with pytest.raises(TypeError):
        parse_duration(True)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0, "0s"), (10, "10s"), (60, "1m"), (5400, "1h30m"), (7776000, "90d"), (0.25, "0.25s")],
)
def test_format_duration(seconds: float, expected: str) -> None:
    """Durations are written in the shortest unit form."""
    assert expected == format_duration(seconds)


@pytest.mark.parametrize("seconds", [0.0, 1.0, 59.0, 3601.0, 93784.0, 0.1, 1e-3, 12345.678, 1e12])
def test_format_duration_round_trips(seconds: float) -> None:
    """parse_duration(format_duration(x)) gives back exactly x."""
    assert seconds == parse_duration(format_duration(seconds))


# ---------------------------------------------------------------------------- which file


def test_missing_default_file_means_defaults(tmp_path: Path) -> None:
    """With no file named and no default file, the built-in defaults apply."""
    assert Config() == load_config(env={}, default_path=tmp_path / "absent.toml")


def test_existing_default_file_is_read(tmp_path: Path) -> None:
    """With no file named, the default file is read when it exists."""
    default = write(tmp_path, '[cluster]\nname = "alpha"\n')
    expected = "alpha"
    assert expected == load_config(env={}, default_path=default).cluster.name


def test_env_var_beats_default_file(tmp_path: Path) -> None:
    """$SLURM_GPU_CONFIG is used instead of the default file."""
    default = write(tmp_path, '[cluster]\nname = "default"\n', "default.toml")
    named = write(tmp_path, '[cluster]\nname = "from-env"\n', "env.toml")
    env = {CONFIG_ENV_VAR: str(named)}
    expected = "from-env"
    assert expected == load_config(env=env, default_path=default).cluster.name


def test_path_beats_env_var(tmp_path: Path) -> None:
    """An explicit path (--config) is used instead of $SLURM_GPU_CONFIG."""
    named = write(tmp_path, '[cluster]\nname = "from-env"\n', "env.toml")
    flag = write(tmp_path, '[cluster]\nname = "from-flag"\n', "flag.toml")
    env = {CONFIG_ENV_VAR: str(named)}
    expected = "from-flag"
    assert expected == load_config(flag, env=env).cluster.name


def test_empty_env_var_is_ignored(tmp_path: Path) -> None:
    """SLURM_GPU_CONFIG set to "" falls through to the default file."""
    env = {CONFIG_ENV_VAR: ""}
    assert locate_config(env=env, default_path=tmp_path / "absent.toml") is None


def test_missing_env_file_is_an_error(tmp_path: Path) -> None:
    """A file named by $SLURM_GPU_CONFIG must exist."""
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError) as caught:
        load_config(env={CONFIG_ENV_VAR: str(missing)}, default_path=tmp_path / "absent.toml")
    assert [f"{missing}: No such file or directory"] == caught.value.problems


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    """A file named by --config must exist; the error names it."""
    missing = tmp_path / "missing.toml"
    assert [f"{missing}: No such file or directory"] == problems_of(missing)


def test_unreadable_file_reports_os_error(tmp_path: Path) -> None:
    """A directory instead of a file gives `<file>: <OSError text>`."""
    assert [f"{tmp_path}: Is a directory"] == problems_of(tmp_path)


def test_non_utf8_file_is_an_error(tmp_path: Path) -> None:
    """A file that is not UTF-8 is reported, not a traceback."""
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[cluster]\nname = "caf\xe9"\n')
    assert problems_of(path)[0].startswith(f"{path}: not UTF-8 text")


def test_read_config_none_gives_defaults() -> None:
    """read_config(None) is the built-in configuration."""
    assert Config() == read_config(None)


# ---------------------------------------------------------------------------- values


def test_valid_file_sets_every_section() -> None:
    """A valid file's values reach the dataclasses, converted to their field types."""
    config = load_config(CONFIGS / "valid.toml", env={})
    expected = dataclasses.replace(
        Config(),
        cluster=dataclasses.replace(Config().cluster, name="alpha"),
        store=StoreSettings(
            url="postgresql+psycopg://slurm_gpu@db.example.org/slurm_gpu",
            readings_retention=Duration(30 * 86400.0),
            ship_aggregate=Duration(120.0),
            echo_sql=True,
        ),
        node=dataclasses.replace(
            NodeSettings(),
            state_dir=Path("/srv/slurm-gpu"),
            interval=Duration(90.0),
            active_threshold_percent=10.0,
            metrics_address=":9400",
        ),
        slurm=dataclasses.replace(
            Config().slurm, bin_dir="/opt/slurm/bin", command_timeout=Duration(60.0)
        ),
        logging=dataclasses.replace(Config().logging, level="DEBUG"),
    )
    assert expected == config


def test_integer_is_accepted_for_float(tmp_path: Path) -> None:
    """active_threshold_percent = 10 (a TOML integer) becomes 10.0."""
    path = write(tmp_path, "[node]\nactive_threshold_percent = 10\n")
    expected = 10.0
    assert expected == load_config(path, env={}).node.active_threshold_percent


def test_config_is_frozen() -> None:
    """Settings cannot be changed after loading."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().node.interval = Duration(1.0)  # type: ignore[misc]


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////var/lib/slurm-gpu/accounting.db",
        "sqlite:///relative.db",
        "sqlite://",
        "postgresql://u:p@db/gpu",
        "postgresql+psycopg://db/gpu",
        "mysql+pymysql://u@db/gpu",
        "mariadb+pymysql://u@db:3306/gpu",
    ],
)
def test_store_url_accepts_supported_databases(tmp_path: Path, url: str) -> None:
    """SQLite, PostgreSQL and MySQL/MariaDB URLs, with or without a driver, are accepted."""
    path = write(tmp_path, f'[store]\nurl = "{url}"\n')
    assert url == load_config(path, env={}).store.url


def test_store_url_error_hides_password(tmp_path: Path) -> None:
    """A rejected URL is echoed without its password."""
    (problem,) = problems_of(CONFIGS / "bad_url_scheme.toml")
    assert "hunter2" not in problem
    assert '"mongodb://accounting:***@db.example.org/gpu"' in problem


@pytest.mark.parametrize("address", ["", ":9400", "0.0.0.0:9400", "node1:9400", "[::]:9400"])
def test_metrics_address_accepts_host_port(tmp_path: Path, address: str) -> None:
    """metrics_address takes "host:port", ":port", an IPv6 "[addr]:port", or "" for off."""
    path = write(tmp_path, f'[node]\nmetrics_address = "{address}"\n')
    assert address == load_config(path, env={}).node.metrics_address


@pytest.mark.parametrize("address", ["9400", "host:", "host:99999", "a b:80"])
def test_metrics_address_rejects_other_text(tmp_path: Path, address: str) -> None:
    """metrics_address without a valid port is an error naming the key."""
    path = write(tmp_path, f'[node]\nmetrics_address = "{address}"\n')
    assert f"{path}: node.metrics_address: expected" in problems_of(path)[0]


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("unknown_key", "node.intervall: unknown key; did you mean 'interval'?"),
        ("wrong_type", 'node.ship_batch_size: expected an integer, got "5000" (string)'),
        ("bool_as_int", "node.missing_after_intervals: expected an integer, got true (boolean)"),
        ("negative_duration", "node.interval: a duration must not be negative, got '-10s'"),
        ("zero_interval", "node.interval: must be greater than 0, got 0 (integer)"),
        ("bad_duration_text", "slurm.command_timeout: unknown unit 'seconds'"),
        ("duration_units_out_of_order", "store.readings_retention: units out of order"),
        (
            "percent_150",
            "node.active_threshold_percent: must be between 0 and 100, got 150 (integer)",
        ),
        ("bad_url_scheme", "store.url: unsupported database URL"),
        (
            "bad_log_level",
            'logging.level: expected one of "DEBUG", "INFO", "WARNING", "ERROR", '
            'got "LOUD" (string)',
        ),
        ("syntax_error", "line 3, column 13: Invalid value"),
        ("unknown_section", "nodes: unknown section; did you mean 'node'?"),
        ("list_for_string", 'cluster.name: expected a string, got ["alpha", "beta"] (array)'),
        ("section_not_table", 'node: expected a table [node], got "gpu1" (string)'),
        ("float_for_int", "node.ship_batch_size: expected an integer, got 2.5 (float)"),
        ("bad_metrics_address", 'node.metrics_address: expected "host:port"'),
        ("empty_path", 'node.state_dir: expected a path, got "" (empty string)'),
        ("duration_as_bool", "store.ship_aggregate: expected a duration"),
    ],
)
def test_broken_config_names_file_and_key(name: str, expected: str) -> None:
    """Each broken file gives one problem: `<file>: <dotted.key>: <what is wrong>`."""
    path = CONFIGS / f"{name}.toml"
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}: {expected}")


def test_all_problems_are_reported_together() -> None:
    """Every problem in a file is reported at once, in file order."""
    path = CONFIGS / "several_problems.toml"
    expected = [
        f"{path}: node.interval: not a duration: 'soon'; expected "
        '"90s", "45m", "2h", "7d", "1h30m" or a number of seconds',
        f"{path}: node.active_threshold_percent: must be between 0 and 100, got -1 (integer)",
        f'{path}: logging.level: expected one of "DEBUG", "INFO", "WARNING", "ERROR", '
        'got "info" (string); did you mean "INFO"?',
    ]
    assert expected == problems_of(path)


def test_unknown_key_without_near_miss_lists_known_keys(tmp_path: Path) -> None:
    """With no close match, the error lists the keys the section accepts."""
    path = write(tmp_path, "[slurm]\nzzz = 1\n")
    expected = [f"{path}: slurm.zzz: unknown key; expected one of: bin_dir, command_timeout, conf"]
    assert expected == problems_of(path)


def test_syntax_error_at_end_of_document_has_position(tmp_path: Path) -> None:
    """An unterminated file still reports a line and column."""
    path = write(tmp_path, '[node]\ninterval = "10s')
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}: line 2, column ")


# ---------------------------------------------------------------------------- generic loader


@dataclass(frozen=True)
class Quota:
    """A [[quota]] table: one required key, one with a default."""

    account: str = field(metadata=doc("Slurm account."))
    gpu_hours: float = field(default=100.0, metadata=doc("GPU-hours per month.", minimum=0))


@dataclass(frozen=True)
class Extras:
    """A section using every container type."""

    tags: list[str] = field(default_factory=list, metadata=doc("Labels."))
    ports: tuple[int, ...] = field(default=(), metadata=doc("Ports."))
    limits: dict[str, Duration] = field(default_factory=dict, metadata=doc("Per-partition."))
    mode: Literal["fast", "safe"] = field(default="safe", metadata=doc("Mode."))
    ratio: float | None = field(default=None, metadata=doc("Optional ratio."))


@dataclass(frozen=True)
class Toy:
    """A schema exercising what Config does not use yet."""

    extras: Extras = field(default_factory=Extras, metadata=doc("Extras."))
    quota: list[Quota] = field(default_factory=list, metadata=doc("Quotas."))


TOY_TEXT = """
[extras]
tags = ["a", "b \\"quoted\\" \\u00e9"]
ports = [80, 443]
limits = { gpu = "2h", "gpu.a100" = 90 }
mode = "fast"
ratio = 0.5

[[quota]]
account = "physics"
gpu_hours = 250

[[quota]]
account = "bio"
"""


def parse_toy(text: str) -> Toy:
    return parse_settings(Toy, tomllib.loads(text), "toy.toml")


def toy_problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_toy(text)
    return caught.value.problems


def test_generic_loader_converts_containers() -> None:
    """Lists, tuples, dicts of durations, Literals, optionals and [[tables]] convert."""
    expected = Toy(
        extras=Extras(
            tags=["a", 'b "quoted" é'],
            ports=(80, 443),
            limits={"gpu": Duration(7200.0), "gpu.a100": Duration(90.0)},
            mode="fast",
            ratio=0.5,
        ),
        quota=[Quota("physics", 250.0), Quota("bio", 100.0)],
    )
    assert expected == parse_toy(TOY_TEXT)


def test_dict_value_of_wrong_type_names_entry_key() -> None:
    """A bad value inside a table of durations names `section.field.entry`."""
    expected = ["toy.toml: extras.limits.gpu: expected a duration"]
    problems = toy_problems('[extras]\nlimits = { gpu = true, cpu = "1h" }\n')
    assert expected == [p[: len(expected[0])] for p in problems]


def test_list_item_of_wrong_type_names_index() -> None:
    """A bad array element names its 1-based position."""
    expected = ["toy.toml: extras.tags[2]: expected a string, got 3 (integer)"]
    assert expected == toy_problems('[extras]\ntags = ["a", 3]\n')


def test_array_of_tables_errors_name_the_table() -> None:
    """Problems inside the 2nd [[quota]] are reported as quota[2].<key>."""
    text = '[[quota]]\naccount = "a"\n[[quota]]\naccount = "b"\ngpu_hours = -1\nextra = 1\n'
    expected = [
        "toy.toml: quota[2].gpu_hours: must be at least 0, got -1 (integer)",
        "toy.toml: quota[2].extra: unknown key; expected one of: account, gpu_hours",
    ]
    assert expected == toy_problems(text)


def test_missing_required_key_is_reported() -> None:
    """A field without a default must be given."""
    expected = ["toy.toml: quota[1].account: missing required key (string)"]
    assert expected == toy_problems("[[quota]]\ngpu_hours = 5\n")


def test_literal_choice_is_type_exact() -> None:
    """A Literal accepts only its listed values."""
    expected = ['toy.toml: extras.mode: expected one of "fast", "safe", got "quick" (string)']
    assert expected == toy_problems('[extras]\nmode = "quick"\n')


def test_toy_schema_round_trips_through_render() -> None:
    """render_config writes every container type as TOML that loads back equal."""
    toy = parse_toy(TOY_TEXT)
    assert toy == parse_toy(render_config(toy))


def test_empty_array_of_tables_round_trips() -> None:
    """A schema with no [[quota]] tables renders and loads back equal."""
    assert Toy() == parse_toy(render_config(Toy()))


# ---------------------------------------------------------------------------- render


def test_default_config_round_trips() -> None:
    """The rendered default config loads back to the defaults."""
    text = render_config(Config())
    assert Config() == parse_settings(Config, tomllib.loads(text), "rendered")


def test_non_default_config_round_trips() -> None:
    """A config with every section changed renders and loads back equal."""
    config = load_config(CONFIGS / "valid.toml", env={})
    assert config == parse_settings(Config, tomllib.loads(render_config(config)), "rendered")


def test_render_with_comments_round_trips() -> None:
    """Rendering with doc comments is still loadable TOML with the same values."""
    text = render_config(Config(), comments=True)
    assert "# How often GPUs are sampled.\ninterval = " in text
    assert Config() == parse_settings(Config, tomllib.loads(text), "rendered")


def test_render_writes_durations_as_text() -> None:
    """Durations are rendered in their readable form."""
    assert 'readings_retention = "90d"' in render_config(Config()).splitlines()


# ---------------------------------------------------------------------------- reference


def test_describe_schema_lists_keys_with_type_and_default() -> None:
    """describe_schema gives key, type in words, default as TOML, and doc."""
    entries = {entry.key: entry for entry in describe_schema()}
    expected = ("node.interval", "duration", '"10s"', "How often GPUs are sampled.")
    assert expected == tuple(entries["node.interval"])


def test_every_schema_field_has_a_doc() -> None:
    """Every section and key carries a one-line doc for the config reference."""
    undocumented = [e.key for e in describe_schema() if not e.doc or "\n" in e.doc]
    expected: list[str] = []
    assert expected == undocumented


def test_describe_schema_covers_array_of_tables() -> None:
    """Keys inside [[quota]] appear as quota.<key>, after the array itself."""
    entries = [(e.key, e.type, e.default) for e in describe_schema(Toy) if "quota" in e.key]
    expected = [
        ("quota", "array of tables", ""),
        ("quota.account", "string", ""),
        ("quota.gpu_hours", "number", "100.0"),
    ]
    assert expected == entries


# ---------------------------------------------------------------------------- example file


def test_example_config_loads_to_defaults() -> None:
    """conf/slurm-gpu.toml is valid and sets every key to its default."""
    assert Config() == load_config(EXAMPLE, env={})


def test_example_config_mentions_every_key() -> None:
    """Every key of the schema is set in conf/slurm-gpu.toml, and nothing else."""
    schema_keys = {e.key for e in describe_schema() if e.type not in ("table", "array of tables")}
    values = frozenset(e.key for e in describe_schema() if e.type.startswith("table of "))
    text = EXAMPLE.read_text()
    example_keys = leaf_keys(tomllib.loads(text), values=values)
    example_keys |= leaf_keys(commented_examples(text), values=values)
    assert schema_keys == example_keys


@pytest.mark.parametrize(
    ("value", "shown"),
    [(10**400, "~2**1329 (integer)"), (-(10**5000), "-~2**16610 (integer)")],
    ids=["1e400", "-1e5000"],  # repr() of the second fails (4300-digit limit)
)
def test_integer_beyond_a_float_is_a_config_error(value: int, shown: str) -> None:
    """An integer too large for a float field names the key, not an OverflowError."""
    with pytest.raises(ConfigError) as caught:
        parse_settings(Config, {"node": {"active_threshold_percent": value}}, "f")
    expected = f"f: node.active_threshold_percent: expected a finite number, got {shown}"
    assert [expected] == caught.value.problems
