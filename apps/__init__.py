"""Applications: the `rlslice` command and everything a person runs.

This is the top layer. Each module is one command (`up`, `scheduler`, `agent`, `probe`,
`run`, `status`, `top`, `timeline`, `demo`, `bench`, `operator`, `plan`, `simulate`,
`diagnose`), with `configure(parser)` and `run(args) -> int`; `cli` dispatches to them.
Applications import the components below them; nothing below imports an application.
"""
