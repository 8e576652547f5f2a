"""Multi-turn agent sessions (BFCL's multi_turn_* suites): data, environments, the session loop,
the state-and-response checker and a ground-truth reference pool."""
