"""Applications: the `rlslice` command and everything a person runs.

This is the top layer. The top level lists commands only: each module is one command
(`up`, `scheduler`, `agent` with `agent_remove`, `probe`, `run`, `status`, `top`,
`operator`, `plan`, `simulate`, `diagnose`, `profile`, `completion`, `advise`), with
`configure(parser)` and `run(args) -> int`; a command with helpers is a subpackage (`demo`,
`timeline`: the command in `command`; `bench`: one module per bench, the soak in
`bench/soak/`); what several commands share is in `shared/`. `cli` wires them.
Applications import the components and the testing kit (`rlslice.testing`: the processes
of the demo, the benches and the soak) below them; nothing below imports an application.
"""
