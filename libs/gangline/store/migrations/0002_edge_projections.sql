-- What the ledger's projections and the API need beyond 0001: the job's full "why pending",
-- its current allocation and attempt, cancellation, and per-node health (cordoned GPUs).

ALTER TABLE jobs
    ADD COLUMN pending_reasons     jsonb NOT NULL DEFAULT '[]',  -- the latest job.pending reasons, in order
    ADD COLUMN allocation_id       text,                         -- the allocation of the current attempt
    ADD COLUMN attempt             integer NOT NULL DEFAULT 1,
    ADD COLUMN cancel_requested_at timestamptz,
    ADD COLUMN submitted_by        text;
CREATE INDEX jobs_submitted_at_job_id ON jobs (submitted_at, job_id);

ALTER TABLE nodes
    ADD COLUMN cordoned_gpus    text[] NOT NULL DEFAULT '{}',   -- GPUs whose health is failed
    ADD COLUMN gpu_health       jsonb NOT NULL DEFAULT '{}',    -- {gpu id: healthy|degraded|failed}
    ADD COLUMN last_seq         bigint,
    ADD COLUMN state_changed_at timestamptz;                    -- time of the event that set `state`

CREATE INDEX allocations_granted_at_key ON allocations (granted_at, allocation_id, rank);
