"""What the monthly delivery mailed, so that nothing goes out twice (revision 0007).

One row per (month, kind, account, recipient): kind "report" (the whole monthly report
to an admin, account "") or "statement" (one account's statement to one of its
coordinators). A delivery is claimed before its message is sent and released when the
sending fails, so two runs at once send it once and a failed one is sent by the next.
Reach it as `store.deliveries` (built once per store); its SQL runs through the `Store`'s
public `reading()`/`writing()` transactions.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from slurm_gpu.store.database import Database
from slurm_gpu.store.schema import report_deliveries


@dataclass(frozen=True)
class Delivery:
    """One message of the monthly delivery.

    Attributes:
        month: YYYY-MM of the report.
        kind: "report" or "statement".
        account: the statement's account ("" for the report).
        recipient: the address it went to.
        time: POSIX seconds it went out.
        message_id: its Message-ID header.
    """

    month: str
    kind: str
    account: str
    recipient: str
    time: float
    message_id: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        """(month, kind, account, recipient): what is sent once."""
        return (self.month, self.kind, self.account, self.recipient)


class DeliveryLog:
    """The record of the monthly delivery in a Store (same database, same cluster).

    Args:
        store: the accounting store; use its `deliveries` attribute rather than building
            another.
    """

    def __init__(self, store: Database) -> None:
        self.store = store
        self.cluster = store.cluster

    def _where(self, key: tuple[str, str, str, str]) -> sa.ColumnElement[bool]:
        c = report_deliveries.c
        month, kind, account, recipient = key
        return sa.and_(
            c.cluster == self.cluster,
            c.month == month,
            c.kind == kind,
            c.account == account,
            c.recipient == recipient,
        )

    def sent(self, month: str) -> list[Delivery]:
        """Everything recorded as sent for `month`, by kind, account and recipient."""
        c = report_deliveries.c
        query = (
            sa.select(c.month, c.kind, c.account, c.recipient, c.time, c.message_id)
            .where(c.cluster == self.cluster, c.month == month)
            .order_by(c.kind, c.account, c.recipient)
        )
        with self.store.reading("reading the monthly deliveries") as conn:
            return [Delivery(*row) for row in conn.execute(query)]

    def claim(self, delivery: Delivery, *, resend: bool = False) -> tuple[bool, Delivery | None]:
        """Records that `delivery` goes out now, unless it went already.

        (A read then an insert or update, in one transaction: drivers disagree on the
        row count of an insert-or-ignore.)

        Args:
            delivery: the message about to be sent.
            resend: claim it even when it went already (its row then says now).

        Returns:
            (claimed, the row recorded before, or None): not claimed means it went already
            and is not to be sent again.
        """
        c = report_deliveries.c
        where = self._where(delivery.key)
        with self.store.writing("recording a monthly delivery") as conn:
            row = conn.execute(
                sa.select(c.month, c.kind, c.account, c.recipient, c.time, c.message_id).where(
                    where
                )
            ).first()
            before = Delivery(*row) if row is not None else None
            if before is not None and not resend:
                return False, before
            if before is not None:
                conn.execute(
                    report_deliveries.update()
                    .where(where)
                    .values(time=delivery.time, message_id=delivery.message_id)
                )
            else:
                conn.execute(
                    report_deliveries.insert().values(
                        cluster=self.cluster,
                        month=delivery.month,
                        kind=delivery.kind,
                        account=delivery.account,
                        recipient=delivery.recipient,
                        time=delivery.time,
                        message_id=delivery.message_id,
                    )
                )
            return True, before

    def release(self, delivery: Delivery, before: Delivery | None = None) -> None:
        """Undoes a claim whose message did not go out: the row says what it said before.

        Args:
            delivery: the claimed message.
            before: what `claim` returned as recorded before (None: forget the row).
        """
        where = self._where(delivery.key)
        with self.store.writing("releasing a monthly delivery") as conn:
            if before is None:
                conn.execute(report_deliveries.delete().where(where))
            else:
                conn.execute(
                    report_deliveries.update()
                    .where(where)
                    .values(time=before.time, message_id=before.message_id)
                )
