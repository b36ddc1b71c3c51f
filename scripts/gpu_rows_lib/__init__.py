"""scripts/gpu_rows.py's parts: the rows file, the machine, the figures, the suite."""
