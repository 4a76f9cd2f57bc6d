// Writes N random JSON Schemas (one per line) from a seed: nested objects, arrays, enums, consts,
// anyOf, local $refs, string bounds and patterns, in the subset grammar/json_schema.h supports,
// small enough that a document fits in the bundled model's context.
// Usage: node gen_schemas.cjs SEED N OUT
const fs = require("fs");
const [seed, n, out] = [Number(process.argv[2]), Number(process.argv[3]), process.argv[4]];

let state = seed >>> 0;
function rand() {  // mulberry32
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const names = ["a", "b", "id", "n", "x", "ok", "tag", "v"];
const patterns = ["^[a-z]{1,4}$", "^\\d{2}-\\d{2}$", "^(red|green|blue)$", "^[A-F0-9]{2,3}$",
                  "^x*y?$", "^[^\"\\\\]{0,3}$", "^é.$"];

function scalar() {
  switch (int(0, 8)) {
    case 0: return {type: "string", maxLength: int(0, 6)};
    case 1: { const min = int(0, 2); return {type: "string", minLength: min, maxLength: min + int(0, 4)}; }
    case 2: return {type: "string", pattern: pick(patterns)};
    case 3: return rand() < 0.5 ? {type: "integer"}
                                : {type: "integer", minimum: int(-20, 5), maximum: int(6, 300)};
    case 4: return rand() < 0.5 ? {type: "number"}
                                : {type: "number", exclusiveMinimum: int(-9, 0) - 0.5,
                                   maximum: int(1, 40) + 0.25};
    case 5: return {type: "boolean"};
    case 6: return {type: "null"};
    case 7: return {enum: [pick(["p", "q\"r", "s t"]), int(-5, 5), pick([true, null, 1.5])]};
    default: return {const: pick(["k", 7, false, {"z": [1]}])};
  }
}

function schema(depth, defs) {
  const r = depth <= 0 ? 0 : int(0, 9);
  if (r <= 3) return scalar();
  if (r <= 5) {
    const props = {};
    const count = int(1, 3);
    const keys = [];
    while (keys.length < count) {
      const k = pick(names);
      if (!keys.includes(k)) keys.push(k);
    }
    for (const k of keys) props[k] = schema(depth - 1, defs);
    const required = keys.filter(() => rand() < 0.5);
    return {type: "object", properties: props, required, additionalProperties: false};
  }
  if (r <= 7) {
    const min = int(0, 1);
    return {type: "array", items: schema(depth - 1, defs), minItems: min, maxItems: min + int(0, 2)};
  }
  if (r === 8) return {anyOf: [schema(depth - 1, defs), schema(depth - 1, defs)]};
  const name = "d" + Object.keys(defs).length;
  defs[name] = {};  // the name is taken before the definition's own refs are drawn
  defs[name] = schema(depth - 1, defs);
  return {$ref: "#/$defs/" + name};
}

const lines = [];
for (let i = 0; i < n; ++i) {
  const defs = {};
  const s = schema(int(1, 3), defs);
  if (Object.keys(defs).length) s.$defs = defs;
  lines.push(JSON.stringify(s));
}
fs.writeFileSync(out, lines.join("\n") + "\n");
