"""python -m cs336_systems.stages.flash: the stage's measuring entry point."""

from cs336_systems.stages.flash.measure import main

main()
