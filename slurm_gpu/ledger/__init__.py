"""The ledger: every rule that turns usage into a figure or a price, each in one place.

Pure: no pandas, no SQLAlchemy, no I/O (numpy arrays in, numpy arrays or plain numbers
out). Every source of usage (the rollups of folded jobs, the raw rows of running and
not-yet-folded ones) is first made into the same sums row (`sums.row_sums`); reports,
the monthly report, statements, the exporter, sacct, the job view and quota turn those
sums into figures (`figures`) and money (`pricing`) here, so two documents about the
same account cannot disagree (issue 24).

- `time`: a GPU row's held time split into active, idle and missing (one definition).
- `sums`: the sums a GPU row adds to any group it is in.
- `figures`: a group's report figures from its summed sums.
- `pricing`: prices per GPU model and slot, the charge and the idle cost per [cost] unit.
- `periods`: proration of a job over a period and over UTC days and months.
"""
