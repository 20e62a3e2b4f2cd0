"""The OpenTelemetry messaging attribute names the bus puts on its spans (semconv 1.3x)."""

from __future__ import annotations

from typing import Final

MESSAGING_SYSTEM: Final = "messaging.system"
MESSAGING_OPERATION_TYPE: Final = "messaging.operation.type"
MESSAGING_OPERATION_NAME: Final = "messaging.operation.name"
MESSAGING_DESTINATION_NAME: Final = "messaging.destination.name"
MESSAGING_DESTINATION_PARTITION_ID: Final = "messaging.destination.partition.id"
MESSAGING_CONSUMER_GROUP_NAME: Final = "messaging.consumer.group.name"
MESSAGING_MESSAGE_ID: Final = "messaging.message.id"
MESSAGING_KAFKA_OFFSET: Final = "messaging.kafka.offset"
MESSAGING_KAFKA_MESSAGE_KEY: Final = "messaging.kafka.message.key"

KAFKA: Final = "kafka"

# Gangline's own attributes: what the event is about.
EVENT_TYPE: Final = "gangline.event.type"
EVENT_SUBJECT: Final = "gangline.event.subject"
EVENT_CAUSATION_ID: Final = "gangline.event.causationid"
