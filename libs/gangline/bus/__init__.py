"""Kafka plumbing: typed producer and consumer, the transactional processor, DLQ, service runner."""

from gangline.bus.chain import ChainStamper, partition_for
from gangline.bus.consumer import Delivery, EventConsumer, decode_or_dead_letter
from gangline.bus.processor import (
    BatchInfo,
    BeforeCommit,
    DeadLetterOutputs,
    Flush,
    Handler,
    Outgoing,
    Processor,
    ProcessorFailed,
    ProcessorStats,
    Select,
)
from gangline.bus.producer import EventProducer
from gangline.bus.records import (
    DLQ_CODE,
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_REASON,
    DLQ_SOURCE_SERVICE,
    DLQ_TOPIC,
    DLQ_TRUNCATED,
    DLQ_VALUE_SHA256,
    DLQ_VALUE_SIZE,
    HANDLER_FAILED,
    MAX_DEAD_LETTER_BYTES,
    DeadLetter,
    RecordMeta,
    dead_letter,
    header,
)
from gangline.bus.runner import run_service, serve
from gangline.bus.settings import ProcessorSettings

__all__ = [
    "DLQ_CODE",
    "DLQ_OFFSET",
    "DLQ_PARTITION",
    "DLQ_REASON",
    "DLQ_SOURCE_SERVICE",
    "DLQ_TOPIC",
    "DLQ_TRUNCATED",
    "DLQ_VALUE_SHA256",
    "DLQ_VALUE_SIZE",
    "HANDLER_FAILED",
    "MAX_DEAD_LETTER_BYTES",
    "BatchInfo",
    "BeforeCommit",
    "ChainStamper",
    "DeadLetter",
    "DeadLetterOutputs",
    "Delivery",
    "EventConsumer",
    "EventProducer",
    "Flush",
    "Handler",
    "Outgoing",
    "Processor",
    "ProcessorFailed",
    "ProcessorSettings",
    "ProcessorStats",
    "RecordMeta",
    "Select",
    "dead_letter",
    "decode_or_dead_letter",
    "header",
    "partition_for",
    "run_service",
    "serve",
]
