-- Limits on an account's sync calls (docs/quotas.md), counted in Redis across API processes.
--   accounts.sync_requests_per_minute  sync calls a minute (a minute's worth may come at once)
--   accounts.sync_tokens_per_minute    their tokens a minute: the prompt's estimate and max_tokens
--                                      at admission, settled to the real count at the end
--   accounts.max_concurrent_sync       sync calls in progress at once
-- NULL: no limit.
ALTER TABLE accounts ADD COLUMN sync_requests_per_minute bigint
  CHECK (sync_requests_per_minute > 0);
ALTER TABLE accounts ADD COLUMN sync_tokens_per_minute bigint CHECK (sync_tokens_per_minute > 0);
ALTER TABLE accounts ADD COLUMN max_concurrent_sync bigint CHECK (max_concurrent_sync > 0);
