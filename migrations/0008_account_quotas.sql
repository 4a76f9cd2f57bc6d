-- Quotas per account (docs/quotas.md).
--   accounts.max_enqueued_requests  the most requests of the account's batches that may be queued
--                                   or running at once; a submit or retry past it is refused whole
--                                   (NULL: no limit)
ALTER TABLE accounts ADD COLUMN max_enqueued_requests bigint CHECK (max_enqueued_requests > 0);

-- The account's open batches: what the quota counts, at every submit.
CREATE INDEX batches_open_by_account_idx ON batches (account_id) WHERE finished_at IS NULL;
