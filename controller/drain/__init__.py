"""Drain: move running work off quarantined GPUs (pure plan and gate in `plan`; the shell in `observe`, `act`,
`loop`, `handoff`)."""
