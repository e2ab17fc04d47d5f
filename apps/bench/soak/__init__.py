"""`rlslice bench soak`: random phases, kills and restarts against a real cluster.

`command` is the bench (`configure`, `run`); `job` the job processes it drives, `check` the
pure history checker, `net` the nftables faults, `scheduler` the scheduler entry point with
short agent deadlines (for the soak and the fault tests).
"""
