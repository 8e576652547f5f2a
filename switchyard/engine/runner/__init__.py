"""runner: one rank's model runner (model_runner), a step's broadcast to the other ranks (broadcast), typed options checked once (options), the collectives (comm: ring, oneshot, auto)."""
