"""python -m cs336_systems.stages.arithmetic: the stage's entry point."""

from cs336_systems.stages.arithmetic.measure import main

main()
