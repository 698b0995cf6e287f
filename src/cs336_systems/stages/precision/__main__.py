"""python -m cs336_systems.stages.precision: the stage's measuring entry point."""

from cs336_systems.stages.precision.measure import main

main()
