"""Between the log and the core: the one events<->core adapter and the one lifecycle fold, shared by
the services and the simulator (pure: no bus, no store)."""
