-- Retention, deletion and retries (docs/retention.md).
--   accounts.retention_seconds  the account's default retention (NULL: the server's --retention-days)
--   batches.retain_seconds      the retention chosen at submit (output_expires_after, else a default)
--   batches.expires_at          created_at + retain_seconds; once the batch has ended and this has
--                               passed, polls answer 404 "expired" and the purge removes its rows.
--                               A batch that ends later than that keeps its results for
--                               min(retain_seconds, 1 hour) after it ends.
--   batches.deleted_at          DELETE by the client: polls answer 404 at once, the purge removes
--                               the rows in bounded chunks
--   batches.retried_from        the batch whose failed, expired and cancelled requests this one
--                               runs again (POST .../retry)
--   files.expires_at            expires_after on upload, else the default; output files expire
--                               with their batch
ALTER TABLE accounts ADD COLUMN retention_seconds integer CHECK (retention_seconds > 0);

ALTER TABLE batches
  ADD COLUMN retain_seconds integer,
  ADD COLUMN expires_at timestamptz,
  ADD COLUMN deleted_at timestamptz,
  ADD COLUMN retried_from uuid;
UPDATE batches SET retain_seconds = 30 * 86400, expires_at = created_at + interval '30 days';
-- The defaults are the server's default retention, for rows written by hand or by tools; the
-- store always sets both.
ALTER TABLE batches ALTER COLUMN retain_seconds SET NOT NULL,
  ALTER COLUMN retain_seconds SET DEFAULT 30 * 86400,
  ALTER COLUMN expires_at SET NOT NULL,
  ALTER COLUMN expires_at SET DEFAULT now() + interval '30 days';

-- The purge's work lists: ended batches by expiry, and batches deleted by their clients.
CREATE INDEX batches_expiry_idx ON batches (expires_at) WHERE finished_at IS NOT NULL;
CREATE INDEX batches_deleted_idx ON batches (id) WHERE deleted_at IS NOT NULL;
-- A batch's retries (shown on the batch).
CREATE INDEX batches_retried_from_idx ON batches (retried_from) WHERE retried_from IS NOT NULL;

ALTER TABLE files ADD COLUMN expires_at timestamptz;
UPDATE files SET expires_at = created_at + interval '30 days';
UPDATE files f SET expires_at = b.expires_at FROM batches b WHERE f.id = b.output_file_id;
UPDATE files f SET expires_at = b.expires_at FROM batches b WHERE f.id = b.error_file_id;
ALTER TABLE files ALTER COLUMN expires_at SET NOT NULL,
  ALTER COLUMN expires_at SET DEFAULT now() + interval '30 days';
CREATE INDEX files_expiry_idx ON files (expires_at);
CREATE INDEX files_deleted_idx ON files (id) WHERE deleted_at IS NOT NULL;

-- The purge removes a batch's events with it.
CREATE INDEX outbox_batch_idx ON outbox (batch_id) WHERE batch_id IS NOT NULL;
