-- Fair share of the queue among accounts (docs/fair-share.md).
--   accounts.weight            the account's share of each model's queue against other accounts
--                              with work waiting (2 gets twice what 1 gets)
--   accounts.default_priority  the priority of the account's batches that name none; a priority
--                              orders an account's own batches only (higher first)
ALTER TABLE accounts ADD COLUMN weight double precision NOT NULL DEFAULT 1
  CHECK (weight > 0 AND weight <= 1000);
ALTER TABLE accounts ADD COLUMN default_priority integer NOT NULL DEFAULT 0
  CHECK (default_priority BETWEEN -100 AND 100);
ALTER TABLE batches ADD CONSTRAINT batches_priority_range CHECK (priority BETWEEN -100 AND 100)
  NOT VALID;

-- What the relay reads per model each pass: its open batches (with requests to send, or in
-- flight), from whose counters it shares the queue.
CREATE INDEX batches_open_model_idx ON batches (model) WHERE finished_at IS NULL;
