// Renders every chat template in a folder over every conversation of a JSON file with
// @huggingface/jinja (the interpreter transformers.js uses), for
// tests/engine/jinja_crosscheck_test.cc.
// Usage: node jinja_crosscheck.mjs NODE_PREFIX TEMPLATES_DIR CONVERSATIONS.json OUT.json
// OUT.json: [{template, conversation, ok, text | error}].
import fs from 'fs';
import path from 'path';
import { createRequire } from 'module';

const [prefix, dir, conversationsFile, outFile] = process.argv.slice(2);
const require = createRequire(path.join(prefix, 'node_modules', 'x.js'));
const { Template } = require('@huggingface/jinja');
const conversations = JSON.parse(fs.readFileSync(conversationsFile, 'utf8'));
const out = [];
for (const file of fs.readdirSync(dir).filter((f) => f.endsWith('.jinja')).sort()) {
  const source = fs.readFileSync(path.join(dir, file), 'utf8');
  let template;
  try {
    template = new Template(source);
  } catch (e) {
    for (const c of conversations) {
      out.push({ template: file, conversation: c.name, ok: false, error: String(e.message) });
    }
    continue;
  }
  for (const c of conversations) {
    try {
      // A fresh copy each time: a template may change what it is given.
      const text = template.render(JSON.parse(JSON.stringify(c.context)));
      out.push({ template: file, conversation: c.name, ok: true, text });
    } catch (e) {
      out.push({ template: file, conversation: c.name, ok: false, error: String(e.message) });
    }
  }
}
fs.writeFileSync(outFile, JSON.stringify(out));
