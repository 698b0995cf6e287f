"""python -m cs336_systems.budget: the presets' budget tables (see the package's docstring)."""

from cs336_systems.budget.tables import main

raise SystemExit(main())
