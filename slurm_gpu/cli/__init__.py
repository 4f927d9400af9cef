"""cli layer of slurm-gpu (see DESIGN.md)."""
