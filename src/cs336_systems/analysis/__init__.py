"""Per-stage analysis: `plot(results_dir, fig_dir)` and `context(results_dir)` for the report."""
