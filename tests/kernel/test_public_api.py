"""The public surface of `rlslice` is small and deliberate: these names, no more."""

import rlslice

EXPECTED = {
    "AbortedError",
    "AlreadyExistsError",
    "AsyncClient",
    "Client",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "Grant",
    "InternalError",
    "InvalidArgumentError",
    "LockLostError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "RlsliceError",
    "UnauthenticatedError",
    "UnavailableError",
    "YieldResult",
    "__version__",
}


def test_the_public_names_are_exactly_the_pinned_ones() -> None:
    assert set(rlslice.__all__) == EXPECTED


def test_every_public_name_resolves() -> None:
    for name in rlslice.__all__:
        assert getattr(rlslice, name) is not None


def test_every_error_derives_from_the_base_error() -> None:
    for name in rlslice.__all__:
        value = getattr(rlslice, name)
        if name.endswith("Error"):
            assert issubclass(value, rlslice.RlsliceError)
