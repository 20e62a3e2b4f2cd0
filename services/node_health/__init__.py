"""Node health: declares silent nodes failed, and frees and requeues the gangs on failed nodes and GPUs."""
