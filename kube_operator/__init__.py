"""The Kubernetes operator (kopf): TimeSliceGroup reconciling, pod mutation, its webhook.

The source folder is `kube_operator/` (pyproject `package-dir` maps it here), so that no
folder of the repository root is named like the standard library's `operator`.
"""
