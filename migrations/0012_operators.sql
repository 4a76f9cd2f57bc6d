-- Operators: an account whose keys may read the whole deployment's load (the dashboard's
-- operator view, GET /v1/operator/stats). `headroom accounts set --operator true` grants it;
-- `headroom serve` grants it to the account of its own key.
ALTER TABLE accounts ADD COLUMN operator boolean NOT NULL DEFAULT false;
