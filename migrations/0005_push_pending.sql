-- Requests put back in the queue after they were dispatched (a lease that expired, a retryable
-- failure, a worker that released them) are pushed to Redis again by whoever put them back, after
-- the commit. push_pending marks a push not yet known to have happened: the janitor pushes such
-- requests again, so that a Redis error or a crash between the commit and the push loses none.
ALTER TABLE requests ADD COLUMN push_pending boolean NOT NULL DEFAULT false;
CREATE INDEX requests_push_pending ON requests (batch_id, idx) WHERE push_pending;
