"""`switchyard plan` (owned by the cluster work)."""


def plan() -> None:
    """Not built yet."""
    raise SystemExit("switchyard plan: not built yet")
