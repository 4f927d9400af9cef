"""click helpers shared by the commands."""

import click

from slurm_gpu.durations import Duration, parse_duration


def duration_option(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> Duration | None:
    """click callback parsing a duration like the config file's: "90s", "1h30m", "600".

    Use as `@click.option("--idle-for", callback=duration_option, metavar="DURATION")`;
    the value the command gets is seconds (float), or None when the option is absent.
    """
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
