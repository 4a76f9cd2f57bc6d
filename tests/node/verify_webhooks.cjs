// Verifies received webhooks with the official Standard Webhooks library (npm `standardwebhooks`),
// independently of the C++ signer. Usage: node verify_webhooks.cjs NODE_PREFIX CASES.json, where
// CASES.json is [{secret, headers: {webhook-id, webhook-timestamp, webhook-signature}, body}].
// Each case must verify, must parse to an event whose id is the webhook-id, and must stop
// verifying when one byte of the body changes. Exits non-zero on any failure.
'use strict';
const fs = require('fs');
const path = require('path');

const { Webhook } = require(path.join(process.argv[2], 'node_modules', 'standardwebhooks'));
const cases = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
let failures = 0;
for (const c of cases) {
  const wh = new Webhook(c.secret);
  try {
    const event = wh.verify(c.body, c.headers);
    if (event.id !== c.headers['webhook-id']) throw new Error('event id differs from webhook-id');
    console.log('verified', c.headers['webhook-id'], event.type);
  } catch (e) {
    failures++;
    console.log('FAILED', c.headers['webhook-id'], e.message);
  }
  try {
    wh.verify(c.body.replace('"', "'"), c.headers);
    failures++;
    console.log('FAILED: a changed body verified', c.headers['webhook-id']);
  } catch (e) {
    // expected
  }
}
if (cases.length === 0) {
  console.log('FAILED: no cases');
  failures++;
}
process.exit(failures ? 1 : 0);
