// Validates constrained answers with ajv (a real JSON Schema validator): each input line is
// {"schema": ..., "text": "..."}; every text must parse as JSON and validate against its schema.
// Prints one JSON summary line; exits 1 when any answer fails.
// Usage: node validate_structured.cjs NODE_PREFIX RESULTS
const path = require("path");
const fs = require("fs");
const Ajv = require(path.join(process.argv[2], "node_modules/ajv"));
const ajv = new Ajv({strict: false, allErrors: false});
let checked = 0;
const samples = [];
const failures = [];
for (const line of fs.readFileSync(process.argv[3], "utf8").split("\n")) {
  if (!line.trim()) continue;
  const r = JSON.parse(line);
  checked++;
  if (samples.length < 3 && r.text.length > 20) samples.push(r.text);
  let value;
  try {
    value = JSON.parse(r.text);
  } catch (e) {
    failures.push({why: "not JSON: " + e.message, text: r.text, schema: r.schema});
    continue;
  }
  const validate = ajv.compile(r.schema);
  if (!validate(value)) failures.push({why: ajv.errorsText(validate.errors), text: r.text, schema: r.schema});
}
console.log(JSON.stringify({checked, failed: failures.length, samples,
                            first_failures: failures.slice(0, 5)}));
process.exit(failures.length ? 1 : 0);
