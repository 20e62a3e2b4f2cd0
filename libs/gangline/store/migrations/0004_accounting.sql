-- Accounting for analytics: GPU-seconds, queue, GPU model, final state and the job's times as columns,
-- and two views: GPU utilisation per queue and GPU model per day, and wait percentiles.
-- A job's times: requested = submitted_at, admitted = admitted_at, granted = granted_at (new: the first
-- grant), started = started_at, ended = finished_at.

ALTER TABLE jobs
    ADD COLUMN gpu_model   text,                                   -- the latest grant's, else quota's charge
    ADD COLUMN granted_at  timestamptz,                            -- the first allocation.granted
    ADD COLUMN gpu_seconds double precision NOT NULL DEFAULT 0,    -- held over every attempt
    ADD COLUMN final_state text;                                   -- completed|failed|cancelled|rejected
CREATE INDEX jobs_final_state_finished_at ON jobs (final_state, finished_at) WHERE final_state IS NOT NULL;

ALTER TABLE allocations
    ADD COLUMN queue       text,
    ADD COLUMN gpu_model   text,                                   -- the grant's, else the node's
    ADD COLUMN gpu_share   double precision,                       -- GPUs of the rank (slices as parts)
    ADD COLUMN gpu_seconds double precision;                       -- set when released
CREATE INDEX allocations_queue_granted_at ON allocations (queue, granted_at);

-- Rows projected before this migration, from what the ledger already holds.
-- (gpu_share: whole GPUs; a slice granted before this migration counts as one GPU.)
UPDATE allocations a
SET queue = e.data ->> 'queue', gpu_model = e.data ->> 'gpu_type', gpu_share = cardinality(a.gpus)
FROM events e
WHERE e.event_id = a.granted_event_id;
UPDATE allocations a SET gpu_model = n.gpu_model FROM nodes n WHERE a.gpu_model IS NULL AND n.node = a.node;
UPDATE allocations
SET gpu_seconds = gpu_share * GREATEST(0, EXTRACT(EPOCH FROM (released_at - granted_at)))
WHERE released_at IS NOT NULL;
UPDATE jobs j
SET granted_at = s.first_grant, gpu_seconds = s.gpu_seconds, gpu_model = s.gpu_model
FROM (
    SELECT job_id, min(granted_at) AS first_grant, COALESCE(sum(gpu_seconds), 0) AS gpu_seconds,
           (array_agg(gpu_model ORDER BY granted_at DESC))[1] AS gpu_model
    FROM allocations GROUP BY job_id
) s
WHERE s.job_id = j.job_id;
UPDATE jobs SET final_state = state WHERE state IN ('rejected', 'completed', 'failed', 'cancelled');

-- GPU-hours each queue held per UTC day and GPU model (allocations cut at midnight; one still held
-- counts up to now), against the GPUs of that model registered now (nodes not lost).
CREATE VIEW queue_utilisation_daily AS
WITH held AS (
    SELECT queue, gpu_model, gpu_share, granted_at, COALESCE(released_at, now()) AS until
    FROM allocations
    WHERE queue IS NOT NULL
), by_day AS (
    SELECT h.queue, h.gpu_model, d.day,
           h.gpu_share * EXTRACT(EPOCH FROM (
               LEAST(h.until, (d.day + interval '1 day') AT TIME ZONE 'UTC')
               - GREATEST(h.granted_at, d.day AT TIME ZONE 'UTC'))) AS gpu_seconds
    FROM held h,
         generate_series(date_trunc('day', h.granted_at AT TIME ZONE 'UTC'),
                         date_trunc('day', h.until AT TIME ZONE 'UTC'), interval '1 day') AS d(day)
), capacity AS (
    SELECT gpu_model, sum(gpu_count) AS gpus FROM nodes WHERE state <> 'lost' GROUP BY gpu_model
)
SELECT b.day::date AS day, b.queue, COALESCE(b.gpu_model, 'unknown') AS gpu_model,
       sum(b.gpu_seconds) / 3600 AS gpu_hours,
       c.gpus AS gpus,
       sum(b.gpu_seconds) / NULLIF(c.gpus * 86400, 0) AS utilisation
FROM by_day b LEFT JOIN capacity c ON c.gpu_model = b.gpu_model
GROUP BY b.day, b.queue, b.gpu_model, c.gpus
HAVING sum(b.gpu_seconds) > 0;

-- Each job's first wait (admission to first grant; the request when admission is unknown).
CREATE VIEW job_waits AS
SELECT job_id, queue, gpu_model, granted_at,
       EXTRACT(EPOCH FROM (granted_at - COALESCE(admitted_at, submitted_at))) AS wait_s
FROM jobs
WHERE granted_at IS NOT NULL;

-- Wait percentiles per UTC day of the grant, queue and GPU model.
CREATE VIEW queue_wait_percentiles_daily AS
SELECT (granted_at AT TIME ZONE 'UTC')::date AS day, queue, COALESCE(gpu_model, 'unknown') AS gpu_model,
       count(*) AS jobs,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_s) AS p50_wait_s,
       percentile_cont(0.9) WITHIN GROUP (ORDER BY wait_s) AS p90_wait_s,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY wait_s) AS p99_wait_s,
       max(wait_s) AS max_wait_s
FROM job_waits
GROUP BY 1, 2, 3;
