"""trainer: Ray rollouts over the env server and distributed policy updates."""
