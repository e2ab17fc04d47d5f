"""Label selectors and the namespace access rule of a TimeSliceGroup. Pure.

A group names who may join it: `spec.namespaces` (names) and/or `spec.namespaceSelector`
(a label selector over namespaces). A pod labelled `rlslice.dev/group: G` in namespace N
is admitted when N is listed or N's labels match the selector; otherwise the webhook
refuses the pod with a message naming G and N. A group that sets neither admits no pod
(fail closed: GPUs are shared, and joining a group lets a pod hold them). A pod naming a
group that does not exist is refused too.

Selectors follow Kubernetes' LabelSelector: every `matchLabels` pair and every
`matchExpressions` requirement (In, NotIn, Exists, DoesNotExist) must hold; an empty
selector matches everything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def requirement_holds(requirement: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether one `matchExpressions` item holds for `labels` (unknown operators do not)."""
    key = str(requirement.get("key", ""))
    operator = requirement.get("operator")
    values: Sequence[str] = requirement.get("values") or ()
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether `labels` satisfy the LabelSelector `selector`."""
    pairs: Mapping[str, str] = selector.get("matchLabels") or {}
    if any(labels.get(key) != value for key, value in pairs.items()):
        return False
    expressions: Sequence[Mapping[str, Any]] = selector.get("matchExpressions") or ()
    return all(requirement_holds(item, labels) for item in expressions)


def needs_namespace_labels(group: Mapping[str, Any] | None, namespace: str) -> bool:
    """Whether deciding needs `namespace`'s labels (a selector, and the name not listed)."""
    spec = (group or {}).get("spec") or {}
    return spec.get("namespaceSelector") is not None and namespace not in (
        spec.get("namespaces") or ()
    )


def admission_refusal(
    group_name: str,
    group: Mapping[str, Any] | None,
    namespace: str,
    namespace_labels: Mapping[str, str] | None,
) -> str | None:
    """Why a pod of `namespace` may not join `group_name` (the TimeSliceGroup `group`, or
    None when it does not exist); None when it may. `namespace_labels` None: unknown (not
    needed, or could not be read), so a selector cannot admit the pod."""
    if group is None:
        return (
            f"TimeSliceGroup {group_name!r} does not exist: a pod of namespace "
            f"{namespace!r} cannot join it"
        )
    spec = group.get("spec") or {}
    listed: Sequence[str] = spec.get("namespaces") or ()
    selector: Mapping[str, Any] | None = spec.get("namespaceSelector")
    if namespace in listed:
        return None
    known = namespace_labels is not None
    if selector is not None and known and selector_matches(selector, namespace_labels or {}):
        return None
    if not listed and selector is None:
        return (
            f"TimeSliceGroup {group_name!r} admits pods of no namespace (it sets neither "
            f"spec.namespaces nor spec.namespaceSelector): namespace {namespace!r} is refused"
        )
    if selector is not None and namespace_labels is None:
        return (
            f"TimeSliceGroup {group_name!r}: the labels of namespace {namespace!r} could not "
            "be read to check spec.namespaceSelector; refused"
        )
    return (
        f"TimeSliceGroup {group_name!r} does not admit pods of namespace {namespace!r} "
        "(not in spec.namespaces, not matched by spec.namespaceSelector)"
    )
