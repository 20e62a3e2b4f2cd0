"""The HTTP API: submit and cancel jobs, read jobs, queues, nodes and the allocation log."""
