"""Notifications reach a real SMTP server and a real webhook receiver on loopback."""

from __future__ import annotations

from dataclasses import replace

from slurm_gpu.config.policy import NotifySettings
from slurm_gpu.models import Action, Verdict
from slurm_gpu.policy.notify import Notifier, notification_key, render
from tests.receivers import smtp_receiver, webhook_receiver

# The [notify] section every test starts from; each test replaces what it is about.
SETTINGS = NotifySettings(
    smtp_host="127.0.0.1",
    smtp_from="slurm-gpu@cluster.example",
    user_email_domain="cluster.example",
    admin_emails=["hpc-admins@cluster.example"],
    exemption_contact="hpc-help@cluster.example",
)


WARN = Verdict(
    "idle_gpu",
    Action.WARN,
    "job:42",
    "GPUs 0,1 on gpu1 below 5% for 45 min.",
    job_id=42,
    user="alice",
    account="physics",
    deadline=1_800_000_000.0,
    details=(("idle_seconds", 2700),),
)


def test_warning_email_reaches_user_and_admins() -> None:
    """The user and the admins get one email saying what, when and whom to ask."""
    with smtp_receiver() as (port, inbox):
        sent = Notifier(replace(SETTINGS, smtp_port=port), "testbed").send(WARN)
    assert ["email"] == sent
    (mail,) = inbox
    assert "alice@cluster.example, hpc-admins@cluster.example" == mail["X-Rcpt-To"]
    assert "[slurm-gpu testbed] idle_gpu: warning (job 42)" == mail["Subject"]
    body = mail.get_payload()
    assert "below 5% for 45 min" in body and "hpc-help@cluster.example" in body
    assert "Next step at:" in body


def test_webhook_gets_slack_style_json() -> None:
    """The webhook receives {"text": ...} with the subject and the reason."""
    with webhook_receiver() as (url, bodies):
        sent = Notifier(replace(SETTINGS, smtp_host="", webhook_url=url), "testbed").send(WARN)
    assert ["webhook"] == sent
    (body,) = bodies
    assert body["text"].startswith("*[slurm-gpu testbed] idle_gpu: warning (job 42)*")


def test_a_dead_channel_does_not_raise() -> None:
    """An unreachable SMTP server is logged; the other channel still works."""
    with webhook_receiver() as (url, bodies):
        sent = Notifier(replace(SETTINGS, smtp_port=1, webhook_url=url), "testbed", timeout=2).send(
            WARN
        )
    assert (["webhook"], 1) == (sent, len(bodies))


def test_dry_run_messages_say_nothing_changed() -> None:
    """A dry-run message tells the reader that Slurm was not touched."""
    assert "dry-run mode" in render(WARN, "c", "", dry_run=True).body


def test_one_key_per_job_and_alert_kind() -> None:
    """Warning and cancel of one job are different keys; two warnings are one."""
    cancel = Verdict("idle_gpu", Action.CANCEL, "job:42", "x", job_id=42)
    assert notification_key(WARN, 0) != notification_key(cancel, 0)
    assert notification_key(WARN, 0) == notification_key(
        Verdict("idle_gpu", Action.WARN, "job:42", "y"), 86400 * 30
    )


def test_node_events_recur_for_new_processes_and_new_drains() -> None:
    """Stray processes: one report per set of pids. A drain: once per admin resume.

    A drain retried (it failed) is the same message, whatever the day; a drain after an
    admin resumed the node (its `resumed_at`) is a new one (issue 25 item 4).
    """

    def stray(*pids: int) -> Verdict:
        details = (("gpu_uuid", "GPU-1"), ("slurm_index", 3), ("pids", pids))
        return Verdict("unallocated_use", Action.REPORT, "node:gpu2", "x", details=details)

    drain = Verdict("hot_node", Action.DRAIN, "node:gpu1", "3 new GPU ECC error(s)")
    again = Verdict(
        "hot_node", Action.DRAIN, "node:gpu1", "3 new GPU ECC error(s)",
        details=(("resumed_at", 5000.0),),
    )  # fmt: skip
    keys = {
        "same pids, later": notification_key(stray(7, 9), 0) == notification_key(stray(7, 9), 5e5),
        "new pid": notification_key(stray(7, 9), 0) == notification_key(stray(7, 11), 0),
        "drain retried, next day": notification_key(drain, 3600) == notification_key(drain, 90000),
        "drain after a resume, same hour": notification_key(drain, 3600)
        == notification_key(again, 7200),
    }
    expected = {
        "same pids, later": True,
        "new pid": False,
        "drain retried, next day": True,
        "drain after a resume, same hour": False,
    }
    assert expected == keys
