"""The pipeline's stages, one folder each, named as in the config and the rules files.

A stage's files sit on the floor of their role: its `plan` on planning's, its measurement on
the measuring floor, its `rows`, `answers`, `figures` and `analysis` on reporting's. A stage
never imports another stage (tests/integration/test_layout.py enforces it); stages meet only through their
CSVs.
"""
