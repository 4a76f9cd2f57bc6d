-- The enqueued-tokens quota (docs/quotas.md).
--   accounts.max_enqueued_tokens  the most tokens (each request's prompt bytes / 4 plus its
--                                 max_tokens) the account's queued and running requests may
--                                 hold; a submit or retry past it is refused whole (NULL: none)
--   batches.enqueued_tokens       that estimate summed over the batch's requests at submit; a
--                                 batch's open share is counted as its requests not yet ended
--                                 over all of them
ALTER TABLE accounts ADD COLUMN max_enqueued_tokens bigint CHECK (max_enqueued_tokens > 0);
ALTER TABLE batches ADD COLUMN enqueued_tokens bigint NOT NULL DEFAULT 0;
