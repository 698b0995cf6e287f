"""python -m cs336_systems.stages.allreduce: the stage's measuring entry point."""

from cs336_systems.stages.allreduce.measure import main

main()
