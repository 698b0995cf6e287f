"""python -m cs336_systems.stages.leaderboard: the stage's measuring entry point."""

from cs336_systems.stages.leaderboard.measure import main

main()
