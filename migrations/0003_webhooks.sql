-- Webhooks: account-level endpoints, the account signing secret for per-batch webhook_url
-- deliveries, one delivery per (event, target) fanned out from the outbox, and every attempt.
-- Secrets are stored as written (whsec_<base64>): signing needs them back.

CREATE TABLE webhook_endpoints (
  id                          uuid PRIMARY KEY,
  account_id                  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  url                         text NOT NULL,
  description                 text NOT NULL DEFAULT '',
  event_types                 text[] NOT NULL,
  enabled                     boolean NOT NULL DEFAULT true,
  disabled_reason             text,
  secret                      text NOT NULL,
  previous_secret             text,            -- still signs until previous_secret_expires_at
  previous_secret_expires_at  timestamptz,
  created_at                  timestamptz NOT NULL DEFAULT now(),
  updated_at                  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_endpoints_account_idx ON webhook_endpoints (account_id);

CREATE TABLE account_webhook_secrets (
  account_id                  uuid PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
  secret                      text NOT NULL,
  previous_secret             text,
  previous_secret_expires_at  timestamptz,
  created_at                  timestamptz NOT NULL DEFAULT now(),
  rotated_at                  timestamptz
);

CREATE TABLE webhook_deliveries (
  id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  seq              bigserial NOT NULL UNIQUE,  -- listing order
  event_id         uuid NOT NULL,              -- the webhook-id, the same on every attempt
  event_type       text NOT NULL,
  account_id       uuid NOT NULL,
  batch_id         uuid,
  endpoint_id      uuid REFERENCES webhook_endpoints (id) ON DELETE CASCADE,  -- NULL: the batch's
  url              text NOT NULL,
  payload          text NOT NULL,              -- the exact body, the same on every attempt
  status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'delivered', 'failed')),
  attempts         integer NOT NULL DEFAULT 0, -- attempts started; fences late result writes
  manual           boolean NOT NULL DEFAULT false,  -- a manual replay: one attempt, no schedule
  next_attempt_at  timestamptz,                -- due (pending), or when a claim lapses
  last_attempt_at  timestamptz,
  last_status_code integer,
  last_error       text,
  delivered_at     timestamptz,
  created_at       timestamptz NOT NULL DEFAULT now()
);
-- The claim query's work list.
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at)
  WHERE status = 'pending';
CREATE INDEX webhook_deliveries_endpoint_idx ON webhook_deliveries (endpoint_id, seq DESC);
CREATE INDEX webhook_deliveries_account_idx ON webhook_deliveries (account_id, seq DESC);
CREATE INDEX webhook_deliveries_batch_idx ON webhook_deliveries (batch_id);

CREATE TABLE webhook_attempts (
  delivery_id  uuid NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
  attempt      integer NOT NULL,
  started_at   timestamptz NOT NULL,
  duration_ms  integer NOT NULL,
  status_code  integer,                        -- NULL: no HTTP answer
  error        text,
  outcome      text NOT NULL CHECK (outcome IN ('delivered', 'retry', 'failed')),
  PRIMARY KEY (delivery_id, attempt)
);

-- Request-level events (request.completed) are written only for batches that asked for them.
ALTER TABLE batches ADD COLUMN request_events boolean NOT NULL DEFAULT false;
