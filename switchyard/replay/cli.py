"""`switchyard replay` (owned by the replay work)."""


def replay() -> None:
    """Not built yet."""
    raise SystemExit("switchyard replay: not built yet")
