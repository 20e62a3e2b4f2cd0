-- Quota's latest queue.status per queue (queues.status): the fair-share figure the API reports.
-- Written only by the ledger, idempotent by event id (the events table); a status older than the
-- row's (by as_of) changes nothing.

CREATE TABLE queue_status (
    queue             text PRIMARY KEY,
    cohort            text NOT NULL,              -- the root cohort of the queue's quota tree
    weight            double precision NOT NULL,
    dominant_share    double precision NOT NULL,  -- DRF over decayed usage, divided by the weight
    dominant_resource text,
    position          integer NOT NULL,           -- fair-share rank in its tree, 1 = lowest share
    ranked_among      integer NOT NULL,           -- how many queues the rank is among
    resources         jsonb NOT NULL,             -- {resource: {used, nominal, borrowed, lendable}}
    as_of             timestamptz NOT NULL,       -- the event time the figures hold after
    event_id          text NOT NULL,
    updated_at        timestamptz NOT NULL        -- the queue.status envelope's time
);
