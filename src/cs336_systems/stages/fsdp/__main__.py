"""python -m cs336_systems.stages.fsdp: the stage's measuring entry point."""

from cs336_systems.stages.fsdp.measure import main

main()
