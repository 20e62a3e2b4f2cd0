"""Where a consumer stands: its position now, and its lag as the Kafka tools count it.

``kafka-consumer-groups.sh`` reports, per partition, the log end offset less the group's committed
offset. A consumer of a transactional topic that commits the offset after the last record it handled
commits the offset of the transaction's commit marker, and its lag never reads 0; committing its
position instead steps over the marker (Kafka Streams' fix, KAFKA-6607). The processor and the ledger
commit :func:`position_now` and serve :func:`lag_by_topic`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition


def position_now(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """The consumer's fetch position of ``tp`` without waiting (None when it has none now, or ``tp`` is
    not assigned): the offset to commit once what it returned is handled, past the transaction markers
    it stepped over. ``AIOKafkaConsumer.position`` would wait for a reset; the state it reads is this."""
    subscription = consumer._subscription.subscription
    assignment = subscription.assignment if subscription is not None else None
    if assignment is None or tp not in assignment.tps:
        return None
    state = assignment.state_value(tp)
    return int(state.position) if state.has_valid_position else None


def lag_by_topic(
    consumer: AIOKafkaConsumer, committed: Mapping[TopicPartition, int], topics: Iterable[str]
) -> dict[str, int]:
    """Records of each of ``topics`` past the ``committed`` offsets (none: 0), over the partitions
    assigned to ``consumer``, each partition's end being its high watermark as of the latest fetch."""
    lag = dict.fromkeys(topics, 0)
    for tp in consumer.assignment():
        end = consumer.highwater(tp)
        if end is not None:
            lag[tp.topic] = lag.get(tp.topic, 0) + max(0, end - committed.get(tp, 0))
    return lag
