"""`rlslice demo`: two RL-shaped jobs, dedicated vs time-sliced, on the sim backend.

`command` is the command (`configure`, `run`); `worker` the job process it starts; `runs`
the records of a run, `report` its table and timeline, `policies` the `--policy` comparison.
"""
