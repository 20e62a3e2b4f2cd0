-- The event ledger (every event, once, by id) and the first projections the API lists.
-- Projections are rebuilt from the log if lost, so they carry no foreign keys that would force an order.

CREATE TABLE events (
    event_id     text PRIMARY KEY,              -- CloudEvents id: the idempotency key
    type         text NOT NULL,                 -- gangline.<event>.v<N>
    source       text NOT NULL,
    subject      text,                          -- the job or node id
    time         timestamptz NOT NULL,          -- when it happened, as the producer says
    topic        text,                          -- where the ledger read it (null when not from Kafka)
    partition    integer,
    "offset"     bigint,
    causation_id text,
    traceparent  text,
    data         jsonb NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_subject_time ON events (subject, time);
CREATE INDEX events_type_time ON events (type, time);
CREATE INDEX events_causation_id ON events (causation_id) WHERE causation_id IS NOT NULL;
CREATE INDEX events_topic_position ON events (topic, partition, "offset") WHERE topic IS NOT NULL;

CREATE TABLE jobs (
    job_id          text PRIMARY KEY,
    queue           text NOT NULL,
    state           text NOT NULL,              -- requested, admitted, rejected, queued, pending, placed, ...
    priority        integer NOT NULL DEFAULT 0,
    workers         integer NOT NULL CHECK (workers > 0),
    gpus_per_worker integer NOT NULL CHECK (gpus_per_worker >= 0),
    gpu_type        text,
    gpu_memory_mib  integer,
    mig_profile     text,
    topology        jsonb,                      -- {"level": ..., "mode": ...}
    preemptible     boolean NOT NULL DEFAULT false,
    reason          text,                       -- why it is pending / was rejected, in a sentence
    reason_code     text,
    spec            jsonb NOT NULL,             -- the job.requested data as received
    submitted_at    timestamptz NOT NULL,
    admitted_at     timestamptz,
    placed_at       timestamptz,
    started_at      timestamptz,
    finished_at     timestamptz,
    updated_at      timestamptz NOT NULL,
    last_event_id   text NOT NULL
);
CREATE INDEX jobs_queue_state ON jobs (queue, state);
CREATE INDEX jobs_state_submitted_at ON jobs (state, submitted_at);

-- One row per rank placement of a grant; released_at is null while the GPUs are held.
CREATE TABLE allocations (
    allocation_id     text NOT NULL,
    job_id            text NOT NULL,
    rank              integer NOT NULL CHECK (rank >= 0),
    node              text NOT NULL,
    gpus              text[] NOT NULL,
    granted_at        timestamptz NOT NULL,
    released_at       timestamptz,
    release_reason    text,                     -- completed, failed, preempted, node_failed, cancelled
    granted_event_id  text NOT NULL,
    released_event_id text,
    PRIMARY KEY (allocation_id, rank)
);
CREATE INDEX allocations_job_id ON allocations (job_id);
CREATE INDEX allocations_node_held ON allocations (node) WHERE released_at IS NULL;
CREATE INDEX allocations_granted_at ON allocations (granted_at);

CREATE TABLE nodes (
    node              text PRIMARY KEY,
    state             text NOT NULL,            -- ready, cordoned, unhealthy, lost
    gpu_count         integer NOT NULL DEFAULT 0,
    gpu_model         text,
    gpus              jsonb NOT NULL DEFAULT '[]',   -- [{"id", "model", "memory_mib", MIG/NVLink facts}]
    nvlink_domain     text,
    leaf              text,
    spine             text,
    labels            jsonb NOT NULL DEFAULT '{}',
    health_reason     text,
    registered_at     timestamptz,
    last_heartbeat_at timestamptz,
    updated_at        timestamptz NOT NULL,
    last_event_id     text NOT NULL
);
CREATE INDEX nodes_state ON nodes (state);
CREATE INDEX nodes_topology ON nodes (spine, leaf, nvlink_domain);
