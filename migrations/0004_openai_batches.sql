-- OpenAI Batch API: what an OpenAI batch object needs beyond the shared batch columns.
--   completion_window  the window as the client wrote it ("24h"); deadline = created_at + window
--   finalized_at       when the output and error files were written (after finished_at); the
--                      OpenAI status stays "finalizing" (or "cancelling") until then
ALTER TABLE batches
  ADD COLUMN completion_window text,
  ADD COLUMN finalized_at timestamptz;

-- The dispatcher's finalize sweep: finished OpenAI batches whose files are not written yet.
CREATE INDEX batches_unfinalized_idx ON batches (id)
  WHERE api_shape = 'openai' AND finished_at IS NOT NULL AND finalized_at IS NULL;
-- GET /v1/batches: an account's OpenAI batches, newest first, keyset pagination on id.
CREATE INDEX batches_openai_account_idx ON batches (account_id, id DESC) WHERE api_shape = 'openai';
