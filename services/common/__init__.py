"""What every decision service shares: topic names, derived ids, settings from the environment, restore."""
