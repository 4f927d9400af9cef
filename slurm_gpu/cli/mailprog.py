"""`slurm-gpu mailprog -s SUBJECT USER`: Slurm's MailProg, with the job's GPU report.

hooks/slurm-gpu-mailprog runs this for slurmctld (slurm.conf `MailProg=`); the logic
is in slurm_gpu/mailprog/ (wrapper.py, delivery.py). The report is what `slurm-gpu job N`
prints, taken from that command itself, so the mail and the terminal never differ.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from pathlib import Path

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.job import job_command
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.mailprog import wrapper as mailprog
from slurm_gpu.mailprog.delivery import DeliveryError
from slurm_gpu.reports.records import job_records
from slurm_gpu.reports.service import open_env
from slurm_gpu.reports.usage import JobFilter

log = logging.getLogger("slurm_gpu.mailprog")


class _StoreReports:
    """A job's GPU report from the store: ready once its summaries are in."""

    def __init__(self, ctx: click.Context, app: App) -> None:
        self._ctx = ctx
        self._app = app
        self._alloc_gpus: int | None = None

    def ready(self, job_id: int) -> bool | None:
        store = self._app.store
        rows = store.job_gpus(job_id)
        if rows:
            return mailprog.summarized(rows, store.job_summaries(job_id))
        # No GPU of the job in the store yet: its agent has not shipped, or it had none.
        # sacct's AllocTRES says which, once (its own report env: the one `job` uses is
        # made when the report is, with the time then).
        if self._alloc_gpus is None:
            app = self._app
            env = open_env(app.config, app.store, app.runner, app.slurm, scope=app.scope)
            usage = env.usage(None, None, JobFilter(job_ids=(str(job_id),)))
            self._alloc_gpus = sum(int(r.get("alloc_gpus") or 0) for r in job_records(usage))
        return None if self._alloc_gpus == 0 else False

    def text(self, job_id: int) -> str:
        # A UTF-8 "terminal": the mail is UTF-8, so the view draws as on the user's screen.
        raw = io.BytesIO()
        out = io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
        with contextlib.redirect_stdout(out):
            self._ctx.invoke(job_command, job_id=str(job_id), as_json=False)
        out.flush()
        return raw.getvalue().decode("utf-8")


@click.command(
    "mailprog",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where the process that waits for the report logs (default: nowhere).",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def mailprog_command(ctx: click.Context, log_file: Path | None, args: tuple[str, ...]) -> None:
    """Send Slurm's mail (`-s SUBJECT USER`, body on stdin) with the job's GPU report.

    Set as slurm.conf's MailProg through hooks/slurm-gpu-mailprog. The mail of a GPU job
    that ended gets the text of `slurm-gpu job N` once the job's summaries are in the
    store ([mailprog] wait at most); every other mail goes on unchanged. Exits 75 having
    sent nothing when it cannot deliver (the wrapper's fallback program then does).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s mailprog: %(message)s")
    body = b"" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    mail = mailprog.parse_mail(args, body, os.environ)
    app_context = ctx.ensure_object(AppContext)
    try:
        config = app_context.config
        deliver = mailprog.delivery_for(config)
    except SlurmGpuError as exc:
        log.error("cannot read the configuration: %s", exc)
        ctx.exit(mailprog.NOT_SENT)
    if deliver is None:
        log.error("no way to send mail: set [mailprog] real_mailprog or [notify] smtp_host")
        ctx.exit(mailprog.NOT_SENT)
    job_id = mailprog.report_job(mail)
    if job_id is None:  # Began, Requeued, an array's summary...: as it is, now
        try:
            deliver(mail)
        except DeliveryError as exc:
            log.error("mail to %s not delivered: %s", ", ".join(mail.recipients), exc)
            ctx.exit(mailprog.NOT_SENT)
        return
    if config.mailprog.detach:
        try:
            if not mailprog.detach(log_file):
                return  # the detached process sends it
        except OSError as exc:
            log.warning("job %s: cannot detach (%s); sending from here", job_id, exc)
    try:
        full = mailprog.with_report(
            mail,
            job_id,
            lambda: _StoreReports(ctx, app_context.app(ctx)),
            config.mailprog.wait,
        )
    except BaseException as exc:  # even a bug must not keep Slurm's mail back
        log.error("job %s: %r", job_id, exc)
        full = mail
    if not mailprog.deliver_once(deliver, full):
        ctx.exit(mailprog.NOT_SENT)  # in the foreground, the wrapper's fallback sends it
    added = "unchanged" if full.body == mail.body else "with a GPU report part"
    log.info("job %s: mail to %s sent, %s", job_id, ", ".join(mail.recipients), added)
