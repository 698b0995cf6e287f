"""python -m cs336_systems.stages.kernel_tests: the stage's measuring entry point."""

from cs336_systems.stages.kernel_tests.measure import main

main()
