"""`make run`: one command from a fresh clone to a living, self-rebalancing simulated fleet."""
