"""python -m cs336_systems.stages.ceilings: the stage's measuring entry point."""

from cs336_systems.stages.ceilings.measure import main

main()
