"""python -m cs336_systems.stages.attention: the stage's measuring entry point."""

from cs336_systems.stages.attention.measure import main

main()
