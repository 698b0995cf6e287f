"""python -m cs336_systems.stages.ddp: the stage's measuring entry point."""

from cs336_systems.stages.ddp.measure import main

main()
