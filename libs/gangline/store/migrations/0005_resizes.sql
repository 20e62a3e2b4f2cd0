-- Elastic resizes: a grant that replaces an allocation at another size names it (allocation.granted's
-- `resizes`); the allocation it replaces is released with reason `resized`. A job's runs are its grants
-- that resize nothing; its size history is its allocations in grant order.

ALTER TABLE allocations ADD COLUMN resizes text;
