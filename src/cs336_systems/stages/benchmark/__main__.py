"""python -m cs336_systems.stages.benchmark: the stage's measuring entry point."""

from cs336_systems.stages.benchmark.measure import main

main()
