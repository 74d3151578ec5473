"""The advisor: doctor checks over gathered facts, the -ts split planner, the overlap baseline.

For the TUI: `planner.plan_split(budgets, model_bytes, kv_bytes, balance)` with budgets from
`rates.budgets(read_topology(source), rates)` or, from a tick, `rates.budgets_from_samples(snap.gpus)`;
`checks.run_checks(gather.gather(source, config))` for the doctor. Nothing here imports textual.
"""
