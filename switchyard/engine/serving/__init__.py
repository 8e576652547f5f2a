"""serving: the HTTP API (http, state, metrics, tokenize), rank 0's start-up (rank0), rank processes (launch), the CLI, request validation (protocol), model names (registry)."""
