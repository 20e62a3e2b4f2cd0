"""Tools built on the services (not services themselves), so they may import any service: the
`gangline` command and the simulator that runs the services' own handlers. Nothing under
services/<name>/ or libs/ imports from here."""
