-- Batches of inference requests, the requests themselves, the transactional outbox, and files
-- for the OpenAI Batch API. Postgres is the source of truth; Redis only carries dispatch signals.

CREATE TABLE batches (
  id                uuid PRIMARY KEY,            -- v7: time-ordered
  account_id        uuid NOT NULL REFERENCES accounts (id),
  model             text NOT NULL,
  api_shape         text NOT NULL CHECK (api_shape IN ('workers_ai', 'openai')),
  status            text NOT NULL CHECK (status IN ('validating', 'queued', 'running', 'completed',
                      'completed_with_errors', 'failed', 'cancelled', 'expired')),
  num_total         integer NOT NULL CHECK (num_total >= 0),
  num_completed     integer NOT NULL DEFAULT 0,  -- succeeded
  num_failed        integer NOT NULL DEFAULT 0,
  num_cancelled     integer NOT NULL DEFAULT 0,
  num_expired       integer NOT NULL DEFAULT 0,
  num_dispatched    integer NOT NULL DEFAULT 0,  -- relay cursor: requests [0, n) are in Redis
  prompt_tokens     bigint NOT NULL DEFAULT 0,
  completion_tokens bigint NOT NULL DEFAULT 0,
  cached_tokens     bigint NOT NULL DEFAULT 0,
  priority          integer NOT NULL DEFAULT 0,
  deadline          timestamptz,
  idempotency_key   text,
  request_hash      bytea,                       -- SHA-256 of the submitted body, for Idempotency-Key
  metadata          jsonb,
  endpoint          text,                        -- OpenAI batches: the endpoint of every line
  input_file_id     uuid,
  output_file_id    uuid,
  error_file_id     uuid,
  errors            jsonb,                       -- validation errors (OpenAI shape)
  webhook_url       text,
  webhook_events    text[],
  webhook_secret    text,
  created_at        timestamptz NOT NULL DEFAULT now(),
  started_at        timestamptz,
  cancel_requested_at timestamptz,
  finished_at       timestamptz,
  CHECK (num_completed + num_failed + num_cancelled + num_expired <= num_total)
);
CREATE UNIQUE INDEX batches_idempotency_idx ON batches (account_id, idempotency_key)
  WHERE idempotency_key IS NOT NULL;
-- Listing an account's batches newest first, optionally by status, with keyset pagination on id.
CREATE INDEX batches_account_idx ON batches (account_id, id DESC);
-- The relay's work list: batches with requests not yet pushed to Redis.
CREATE INDEX batches_undispatched_idx ON batches (id)
  WHERE num_dispatched < num_total AND status IN ('queued', 'running');
-- The janitor's deadline sweep.
CREATE INDEX batches_deadline_idx ON batches (deadline)
  WHERE deadline IS NOT NULL AND finished_at IS NULL;

CREATE TABLE requests (
  batch_id          uuid NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
  idx               integer NOT NULL,            -- input index, the Workers-AI response id
  custom_id         text,                        -- external_reference / OpenAI custom_id
  body              text NOT NULL,               -- the normalized request, JSON
  status            text NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'running',
                      'completed', 'failed', 'cancelled', 'expired')),
  attempt           integer NOT NULL DEFAULT 0,  -- leases taken; fences late writes from stale ones
  num_failures      integer NOT NULL DEFAULT 0,  -- failed attempts and expired leases
  lease_owner       text,
  lease_expires_at  timestamptz,
  result            text,                        -- JSON
  error             text,                        -- JSON {code, message}
  prompt_tokens     integer,
  completion_tokens integer,
  cached_tokens     integer,
  started_at        timestamptz,
  finished_at       timestamptz,
  PRIMARY KEY (batch_id, idx)
) WITH (fillfactor = 80);                        -- room for HOT updates as requests move on
-- The janitor's lease sweep.
CREATE INDEX requests_lease_idx ON requests (lease_expires_at) WHERE status = 'running';

CREATE TABLE outbox (
  id            bigserial PRIMARY KEY,
  event_id      uuid NOT NULL UNIQUE,            -- stable webhook-id
  event_type    text NOT NULL,                   -- batch.queued, batch.completed, ...
  account_id    uuid NOT NULL,
  batch_id      uuid,
  payload       jsonb NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT now(),
  processed_at  timestamptz
);
CREATE INDEX outbox_pending_idx ON outbox (id) WHERE processed_at IS NULL;

-- What the dispatchers last saw of Redis (its run id and epoch marker), to notice a Redis that
-- restarted or lost its data and must be refilled from Postgres.
CREATE TABLE redis_state (
  key    text PRIMARY KEY,
  value  text NOT NULL
);

CREATE TABLE files (
  id          uuid PRIMARY KEY,
  account_id  uuid NOT NULL REFERENCES accounts (id),
  purpose     text NOT NULL,
  filename    text NOT NULL,
  bytes       bigint NOT NULL,
  num_lines   integer,
  created_at  timestamptz NOT NULL DEFAULT now(),
  deleted_at  timestamptz
);
CREATE INDEX files_account_idx ON files (account_id, id DESC);

CREATE TABLE file_chunks (
  file_id  uuid NOT NULL REFERENCES files (id) ON DELETE CASCADE,
  seq      integer NOT NULL,
  data     bytea NOT NULL,
  PRIMARY KEY (file_id, seq)
);
