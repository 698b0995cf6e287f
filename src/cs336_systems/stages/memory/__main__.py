"""python -m cs336_systems.stages.memory: the stage's measuring entry point."""

from cs336_systems.stages.memory.measure import main

main()
