"""The GPM means of a row that keeps per-metric sums (hourly rollups, running-job totals).

A row stores, per GPM metric, its percent-seconds (`<metric>_weighted_sum`) and the seconds
GPM measured it (`<metric>_gpm_seconds`), so rows fold exactly; the mean is read here, once,
and is None where nothing was measured (unknown, never 0 %).
"""

from __future__ import annotations


class GpmMeans:
    """Mixin: the four `*_mean_percent` properties named like the model fields."""

    def _gpm_mean(self, metric: str) -> float | None:
        seconds: float = getattr(self, f"{metric}_gpm_seconds")
        if seconds <= 0:
            return None
        weighted: float = getattr(self, f"{metric}_weighted_sum")
        return weighted / seconds

    @property
    def sm_active_mean_percent(self) -> float | None:
        """Mean SM activity over the GPM-measured seconds (None: not measured)."""
        return self._gpm_mean("sm_active")

    @property
    def sm_occupancy_mean_percent(self) -> float | None:
        """Mean SM occupancy over the GPM-measured seconds (None: not measured)."""
        return self._gpm_mean("sm_occupancy")

    @property
    def tensor_active_mean_percent(self) -> float | None:
        """Mean tensor-pipe activity over the GPM-measured seconds (None: not measured)."""
        return self._gpm_mean("tensor_active")

    @property
    def dram_bw_mean_percent(self) -> float | None:
        """Mean DRAM bandwidth use over the GPM-measured seconds (None: not measured)."""
        return self._gpm_mean("dram_bw")
