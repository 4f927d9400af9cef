"""Slurm's MailProg wrapper: the job's GPU report in Slurm's end-of-job mail.

- `wrapper`: which mail gets a report, the bounded wait for the job's summaries, what
  the mail says when the report is late or failed.
- `delivery`: how the mail leaves (the real mail program, SMTP, an outbox folder).

It sits beside app.py: above store/ and config/, below cli/ (`slurm-gpu mailprog`,
hooks/slurm-gpu-mailprog).
"""
