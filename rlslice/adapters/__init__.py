"""The kernel's I/O adapters, shared by every component.

The rest of the kernel (`rlslice`, `rlslice.config`, ids, errors) is pure; everything here
talks to the outside: gRPC channels and their auth (`channel`, `auth`), the translation of
gRPC status codes to rlslice errors (`grpc_errors`), the Kubernetes API (`kube`), socket
addresses (`net`) and OpenTelemetry (`tracing`). Pure cores never import this package
(an import-linter contract says so).
"""
