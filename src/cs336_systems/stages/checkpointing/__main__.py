"""python -m cs336_systems.stages.checkpointing: the stage's measuring entry point."""

from cs336_systems.stages.checkpointing.measure import main

main()
