"""An Osmosis workspace read: eval configs, plans, and rollouts imported in isolation."""
