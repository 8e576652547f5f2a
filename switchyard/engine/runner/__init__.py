"""runner: one rank's model runner, the Step value it runs and broadcasts to the other ranks, the collectives (ring, oneshot, auto)."""
