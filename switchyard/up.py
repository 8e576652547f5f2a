"""`switchyard up`: the embedded default (owned by the engine work)."""


def up() -> None:
    """Not built yet."""
    raise SystemExit("switchyard up: not built yet")
