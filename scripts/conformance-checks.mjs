// Holds a conformance suite run to a list of expected failing checks
// (scripts/conformance --suite-version next).
//
//   node scripts/conformance-checks.mjs RESULTS_DIR LIST SCENARIO...
//
// RESULTS_DIR is the suite's `-o` directory: one `server-<scenario>-<time>`
// directory per scenario run, each with its checks.json. LIST has one
// `scenario/check-id  # reason` a line (blank lines and `#` lines ignored).
// A check fails when its status is FAILURE or WARNING (as in the suite's own
// baseline check). Exit 0 when the failing checks of the SCENARIOs are
// exactly the listed ones; 1 on an unlisted failure, on a listed check that
// did not fail (the list must stay honest), or on a SCENARIO with no results.
//
// Per check rather than per scenario: server-stateless has two SHOULDs the
// broker cannot meet among 30 checks, and listing the whole scenario would
// stop guarding the other 28.
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

const [resultsDir, listPath, ...scenarios] = process.argv.slice(2);
if (!resultsDir || !listPath || scenarios.length === 0) {
  console.error('usage: conformance-checks.mjs RESULTS_DIR LIST SCENARIO...');
  process.exit(1);
}

const expected = new Map();
let bad = false;
for (const line of readFileSync(listPath, 'utf8').split('\n')) {
  const [entry, ...why] = line.split('#');
  const name = entry.trim();
  if (!name) continue;
  if (!/^[^/\s]+\/[^/\s]+$/.test(name)) {
    console.error(`${listPath}: '${name}' is not scenario/check-id`);
    bad = true;
    continue;
  }
  expected.set(name, why.join('#').trim());
}

// server-<scenario>-<ISO time with - for :>, e.g.
// server-caching-2026-11-30T22-02-52-737Z
const dirPattern = /^server-(.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$/;
const results = new Map();
for (const d of readdirSync(resultsDir)) {
  const m = dirPattern.exec(d);
  if (!m) continue;
  if (results.has(m[1])) {
    console.error(`${resultsDir}: two result directories for ${m[1]}`);
    bad = true;
  }
  results.set(m[1], JSON.parse(readFileSync(join(resultsDir, d, 'checks.json'), 'utf8')));
}

const failing = new Map();
let checks = 0;
for (const s of scenarios) {
  const cs = results.get(s);
  if (!cs) {
    console.error(`scenario ${s} has no results in ${resultsDir}: it did not run`);
    bad = true;
    continue;
  }
  for (const c of cs) {
    checks++;
    if (c.status === 'FAILURE' || c.status === 'WARNING') {
      const key = `${s}/${c.id}`;
      if (!failing.has(key)) failing.set(key, `${c.status}: ${c.errorMessage ?? ''}`);
    }
  }
}

const ran = new Set(scenarios);
for (const [key, what] of failing) {
  if (expected.has(key)) {
    console.log(`expected failure ${key} (${expected.get(key)})`);
  } else {
    console.error(`UNEXPECTED failure ${key}: ${what}`);
    bad = true;
  }
}
for (const key of expected.keys()) {
  if (ran.has(key.split('/')[0]) && !failing.has(key)) {
    console.error(`STALE entry ${key}: the check did not fail; remove it from ${listPath}`);
    bad = true;
  }
}
console.log(
  `${scenarios.length} scenarios, ${checks} checks, ${failing.size} distinct failing checks` +
    (bad ? '' : ', all listed'),
);
process.exit(bad ? 1 : 0);
