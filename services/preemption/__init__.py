"""Preemption: frees GPUs for urgent gangs by checkpointing, releasing and requeueing preemptible work."""
