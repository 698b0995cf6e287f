"""python -m cs336_systems.stages.profile: the stage's measuring entry point."""

from cs336_systems.stages.profile.measure import main

main()
