"""The rlslice wire protocol, version v1alpha1: generated from the `.proto` files beside this.

`scheduler_pb2`/`scheduler_pb2_grpc` hold the scheduler service; `agent_pb2`/`agent_pb2_grpc`
the snapshot agent. Regenerate with `make proto`; a test fails when they drift.
"""
