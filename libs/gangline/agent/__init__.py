"""The node agent's library: launch a gang's local ranks, restart it per policy, checkpoint on preemption.

The Kafka-facing shell (``services/agent``) turns ``allocation.granted`` into a :class:`LaunchSpec`
(see :func:`gangline.agent.env.layout_for_node`), runs a :class:`GangSupervisor` per job, publishes
the :mod:`gangline.agent.events` it emits, and forwards peers' failures (``peer_failed``) and
``job.preempting`` (``preempt``) back into it.

That shell is :class:`gangline.agent.node.NodeAgent` (settings in :mod:`gangline.agent.settings`,
runners in :mod:`gangline.agent.runner`: ``ProcessRunner`` for real workers,
:class:`gangline.agent.simulated.SimulatedRunner` for fake clusters and tests).
"""
