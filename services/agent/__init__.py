"""Node agents: the simulated GPU nodes (``gangline fake-nodes``) that stand in for real ones."""
