"""``scarcelab compare``: the fair, budgeted answer to "which method on my data?".

* :mod:`.grid` — the grid (labeled-only baselines, semi and self methods, seeds), its YAML
  file, the name checks, the split of a total budget over the cells and the sweep spec that
  runs them; no MLflow, no torch (``--dry-run`` is instant);
* :mod:`.analysis` — best, tied and worse methods, the gain over the best labeled-only
  method with its interval, from a per-seed table (pure pandas + ``tracking.stats``);
* :mod:`.report` — the per-seed table read from the tracking store, the markdown / CSV
  report, and its ``report`` run.

docs/compare.md says what the grid is, how the budget is split and why the test is what it
is.
"""
