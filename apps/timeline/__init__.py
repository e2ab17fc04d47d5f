"""`rlslice timeline`: a group's timeline as a Chrome trace or a PNG.

`command` is the command (`configure`, `run`); `trace_export` the pure part that turns
scheduler events into lanes and a trace.
"""
