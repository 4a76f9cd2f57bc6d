// Real answers of a running headroom against the schemas of api/openapi.json, with ajv (JSON
// Schema 2020-12, OpenAPI 3.1's dialect): node openapi_answers.cjs NODE_MODULES OPENAPI DIR,
// where DIR holds the answers tests/scripts/openapi_answers_test.sh collected. Exits 1 naming
// each answer that does not match.
const Ajv = require(process.argv[2] + "/ajv/dist/2020").default;
const fs = require("fs");
const doc = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
const ajv = new Ajv({ strict: false, allErrors: true, logger: false });
ajv.addSchema({ $id: "doc", components: doc.components }, "doc");
const schema = (name) => ({ $ref: "doc#/components/schemas/" + name });
const enveloped = (name) => ({
  allOf: [schema("WorkersAiEnvelope"), { properties: { result: schema(name) } }],
});
const checks = [
  ["submit.json", enveloped("Submitted")],
  ["poll.json", enveloped("PollResult")],
  ["list.json", enveloped("BatchList")],
  ["run.json", enveloped("WorkersAiResult")],
  ["chat.json", schema("ChatCompletion")],
  ["models.json", schema("ModelList")],
  ["file.json", schema("FileObject")],
  ["files.json", schema("FileList")],
  ["batch.json", schema("BatchObject")],
  ["batches.json", schema("BatchObjectList")],
  ["endpoint.json", enveloped("WebhookEndpoint")],
  ["endpoints.json", enveloped("WebhookEndpointList")],
  ["secret.json", enveloped("SigningSecret")],
  ["deliveries.json", enveloped("WebhookDeliveryList")],
  ["err_wa.json", schema("WorkersAiErrorBody")],
  ["err_oa.json", schema("OpenAiErrorBody")],
  ["health.json", schema("Health")],
  ["operator.json", enveloped("OperatorStats")],
  ["poll_filtered.json", enveloped("PollResult")],
];
let bad = 0;
for (const [file, s] of checks) {
  const data = JSON.parse(fs.readFileSync(process.argv[4] + "/" + file, "utf8"));
  if (!ajv.validate(s, data)) {
    bad++;
    console.log("FAIL " + file + ": " + JSON.stringify(ajv.errors.slice(0, 4)));
  }
}
console.log(bad === 0 ? "openapi answers: " + checks.length + " valid" : bad + " invalid");
process.exit(bad === 0 ? 0 : 1);
