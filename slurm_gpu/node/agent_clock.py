"""The agent's clock (issue 25 item 3): a monotonic anchor, and the wall clock's steps.

The agent's time is the wall clock at an anchor plus the monotonic time since, so read
windows never go negative nor overlap when the wall clock steps (NTP). `AgentClock` keeps
the anchor, how far the wall clock is behind after a step back (`lag`) and a forward step
re-anchored at this tick (`jump`); the instants other parts of the agent keep are moved
with it through `on_shift`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

# The agent's logger: what the tick's collaborators log reads as the agent's, as before.
log = logging.getLogger("slurm_gpu.node.agent")


def _iso(posix: float) -> str:
    """A POSIX time as UTC ISO 8601 (for the log)."""
    return datetime.fromtimestamp(posix, UTC).isoformat(timespec="seconds")


class AgentClock:
    """The agent's time: the wall clock at an anchor plus the monotonic time since.

    Args:
        wall: POSIX time (the wall clock).
        monotonic: a clock that never steps (seconds). None: time.monotonic with the real
            wall clock, else `wall` itself (a test's clock, which steps only when the test
            says so: pass both to step the wall alone).
        step: a wall clock further than this many seconds from the agent's time, either
            way, has stepped: logged, and never measured twice nor as a gap.
        on_shift: moves the instants the agent keeps by its argument (seconds) when the
            clock is re-anchored.
    """

    def __init__(
        self,
        wall: Callable[[], float],
        monotonic: Callable[[], float] | None,
        step: float,
        on_shift: Callable[[float], None],
    ) -> None:
        self.wall = wall
        if monotonic is None:
            monotonic = time.monotonic if wall is time.time else wall
        self.monotonic = monotonic
        self.step = step
        self.on_shift = on_shift
        self.anchor: tuple[float, float] | None = None  # (wall, monotonic) at the anchor
        self.lag = 0.0  # seconds the wall clock is behind the agent's time (a step back)
        self.jump = 0.0  # a forward step re-anchored at this tick: missing, never measured

    def tick_time(self) -> float:
        """This tick's time: the wall clock at the anchor plus the monotonic time since.

        Interval lengths and order come from the monotonic clock, so a wall clock step
        (NTP) never makes a read window negative or lets two windows of a GPU overlap.
        The wall clock is compared every tick; one further than `step` from where it
        should be has stepped, which is logged once:

        - back (it ran ahead and was corrected): the agent keeps its own time, now ahead
          of the wall clock by `lag`, while any job holds a GPU here, so a running job is
          charged the time it really held (the monotonic time, which is Slurm's elapsed
          time: slurmctld's clock did not step) and no second interval ever covers wall
          time already written. Its intervals may end up to `lag` after the epilog's wall
          time; the hooks' times (span start, end) are kept as the hooks wrote them, and
          only decide a job's edges at the tick that reads them, within one interval. Once
          no job holds a GPU here, `rejoin_wall` goes back on the wall clock, and each
          GPU's intervals start again after the last one written (the wall time the clock
          repeats is not measured: missing, on a node no job held).
        - forward: the agent re-anchors on the wall clock, first using up any `lag`; the
          rest of the jump is time the agent never measured: each GPU's next window starts
          its monotonic interval before this read, and the jump stays uncovered (missing),
          never an interval with readings it did not take.
        """
        wall, mono = self.wall(), self.monotonic()
        if self.anchor is None:
            self.anchor = (wall, mono)
            return wall
        now = self.anchor[0] + (mono - self.anchor[1])
        drift = wall - (now - self.lag)
        if abs(drift) <= self.step:
            return now
        at = _iso(wall)
        if drift < 0:
            self.lag -= drift
            log.warning(
                "wall clock stepped back %.1f s at %s; intervals continue on the monotonic"
                " clock (%.1f s ahead of the wall clock while a job holds a GPU here)",
                -drift,
                at,
                self.lag,
            )
        else:
            caught = min(self.lag, drift)
            self.lag = max(0.0, self.lag - caught)
            jump = drift - caught
            if jump > 0:
                self.jump += jump
                self.on_shift(jump)
                now += jump
            log.warning(
                "wall clock stepped forward %.1f s at %s; intervals continue on the monotonic"
                " clock: %s",
                drift,
                at,
                f"the {jump:.1f} s jump is missing time, never measured"
                if jump > 0
                else "back on the wall clock",
            )
        self.anchor = (now, mono)
        return now

    def rejoin_wall(self, now: float) -> float:
        """No job holds a GPU here: the agent's time goes back on the wall clock.

        Returns `now` on the wall clock. Each GPU's reads stay where they are
        (`gpu_state`): its windows start again once the wall clock passes its last read,
        so nothing written is covered twice (the caller ends the runs of readings).
        """
        back, self.lag = self.lag, 0.0
        assert self.anchor is not None
        self.anchor = (self.anchor[0] - back, self.anchor[1])
        self.on_shift(-back)
        return now - back

    def committed(self) -> None:
        """The tick committed: the states it kept are on the re-anchored clock."""
        self.jump = 0.0
