"""Tools that see every service: the `gangline` command, the simulator that runs the services' own
handlers. Nothing under services/<name>/ or libs/ imports from here."""
