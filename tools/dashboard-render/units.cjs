// Grafana's own unit registry (@grafana/data, Apache-2.0) asked about unit ids: for each id given
// as an argument, whether Grafana knows it (an unknown id silently formats as a custom suffix, so
// membership is the check) and how Grafana formats 412.3 with it. Prints one JSON object.
// Run by tests/dashboards/test_units.py over every unit the dashboards use.
const path = require('node:path');

// The formatters read a few browser globals (locale, boot settings); Node has none of them. The
// index of @grafana/data needs a whole DOM, so the value-format module is loaded by its own path.
if (typeof navigator === 'undefined') globalThis.navigator = { language: 'en-US', languages: ['en-US'] };
if (typeof window === 'undefined') globalThis.window = {};
const dir = path.dirname(require.resolve('@grafana/data'));
const { getValueFormat, getValueFormats } = require(path.join(dir, 'valueFormats', 'valueFormats.cjs'));

const known = new Set();
for (const category of getValueFormats()) for (const unit of category.submenu) known.add(unit.value);
const out = {};
for (const id of process.argv.slice(2)) {
  const formatted = getValueFormat(id)(412.3, 2);
  out[id] = { known: known.has(id), text: `${formatted.prefix ?? ''}${formatted.text}${formatted.suffix ?? ''}` };
}
process.stdout.write(JSON.stringify(out) + '\n');
