"""The run directory: what a run leaves on disk and how it is found again, through either door, and the signal that
asks a run to stop and save (rundir), its checkpoints (checkpoints), metrics.jsonl and TensorBoard (metrics_log), one
writer at a time (lock)."""
