"""Tools built on the services (not services themselves): they may import any service."""
