#!/usr/bin/env python3
"""CPU per request across cores: the sidecar beside nginx and haproxy, in one run.

Every process is pinned: the proxy under test on cores 0..N-1, wrk on WRK_CORES, the
upstream (nginx serving /ok, the benchmark note and the hosted context) on UP_CORES.
For each N in SCALE, nginx (N workers, upstream keep-alive), haproxy (N threads,
`http-reuse always`) and each sidecar build (`runtime.threads = N`) serve passthrough
`GET /ok`; each sidecar also serves the REST section-source of a 7.4 KB note, with one
caller and with USERS callers (a wrk script picks a token per request), and nginx serves
the note itself (the "note-fetch" row). A bare pulldown-cmark pass over the same note
(the "note-parse-floor" row) completes the REST reference. Rounds alternate the proxies;
each figure is the median of ROUNDS rounds.

CPU per request is utime + stime of the proxy's processes over the requests wrk
completed in the round. On a machine with fewer cores than the pinning needs, everything
shares the cores and only ratios within one run mean anything.

usage: scaling.py OUT_DIR
  env: SIDECARS=label=/path/to/knowtation-sidecar[,label=...] (default: the release
       binary of this checkout), PULLDOWN=/path/to/pulldown-bare (the parse floor;
       default: this checkout's release example, row skipped when absent),
       BIN_DIR=folder with nginx, wrk, haproxy (default: PATH), SCALE=1,2,4,8 ROUNDS=3
       SECS=5 CONNS=48 USERS=1000, WRK_CORES and UP_CORES (default: the last 8 cores,
       4 each; on 2 cores: WRK_CORES=0,1 UP_CORES=0,1 SCALE=1,2).
Writes OUT_DIR/results.json and OUT_DIR/log.txt.
"""
import base64, hashlib, hmac, json, os, re, shutil, signal, socket, subprocess, sys, tempfile, time

OUT = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else sys.exit(__doc__)
os.makedirs(OUT, exist_ok=True)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count()
SCALE = [int(x) for x in os.environ.get("SCALE", "1,2,4,8").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SECS = int(os.environ.get("SECS", "5"))
CONNS = int(os.environ.get("CONNS", "48"))
USERS = int(os.environ.get("USERS", "1000"))
SECRET = "scaling-bench-secret-0123456789abcdef"
BIN_DIR = os.environ.get("BIN_DIR")
ENV = dict(os.environ)
if BIN_DIR and os.path.isdir(os.path.join(BIN_DIR, "..", "lib")):
    ENV["LD_LIBRARY_PATH"] = os.path.abspath(os.path.join(BIN_DIR, "..", "lib"))
LOG = open(os.path.join(OUT, "log.txt"), "w")


def tool(name):
    path = os.path.join(BIN_DIR, name) if BIN_DIR else shutil.which(name) or shutil.which(name, path="/usr/sbin")
    return path if path and os.path.exists(path) else None


def say(*a):
    line = " ".join(str(x) for x in a)
    print(line, flush=True)
    LOG.write(line + "\n")
    LOG.flush()


def span(lo, hi):
    return ",".join(str(c) for c in range(lo, hi))


WRK_CORES = os.environ.get("WRK_CORES") or span(max(NCPU - 8, 0), max(NCPU - 4, 1))
UP_CORES = os.environ.get("UP_CORES") or span(max(NCPU - 4, 0), NCPU)
SIDECARS = [tuple(x.split("=", 1)) for x in os.environ.get(
    "SIDECARS", "sidecar=" + os.path.join(REPO, "target/release/knowtation-sidecar")).split(",")]
PULLDOWN = os.environ.get("PULLDOWN", os.path.join(REPO, "target/release/examples/pulldown-bare"))


def ticks(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total


def threads(pid):
    """Per thread of `pid`: its name, CPU ticks and context switches (voluntary: it
    waited and was woken; involuntary: preempted)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = dict(l.split(":", 1) for l in f.read().splitlines() if ":" in l)
            out[tid] = (name, int(fields[11]) + int(fields[12]),
                        int(status["voluntary_ctxt_switches"]) + int(status["nonvoluntary_ctxt_switches"]))
        except (OSError, KeyError, ValueError):
            pass
    return out


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def token(sub):
    enc = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    head = enc(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = enc(json.dumps({"sub": sub}).encode())
    sig = enc(hmac.new(SECRET.encode(), f"{head}.{claims}".encode(), hashlib.sha256).digest())
    return f"{head}.{claims}.{sig}"


def wrk(url, headers=(), script=None):
    cmd = ["taskset", "-c", WRK_CORES, tool("wrk"), "-t4", f"-c{CONNS}", f"-d{SECS}s", "--latency"]
    if script:
        cmd += ["-s", script]
    for h in headers:
        cmd += ["-H", h]
    out = subprocess.run(cmd + [url], capture_output=True, text=True, env=ENV, timeout=SECS + 30).stdout
    done = re.search(r"(\d+) requests in", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    lat = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", out, re.M))
    return int(done.group(1)) if done else 0, int(bad.group(1)) if bad else 0, lat


def millis(s):
    v = float(re.match(r"[\d.]+", s).group(0))
    if s.endswith("us"):
        return v / 1000
    if s.endswith("ms"):
        return v
    return v * 1000 if s.endswith("s") else v


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv, pin, name):
    err = open(os.path.join(OUT, f"{name}.err"), "w")
    p = subprocess.Popen(["taskset", "-c", pin] + argv, env=ENV, stdout=subprocess.DEVNULL, stderr=err)
    time.sleep(0.8)
    if p.poll() is not None:
        say(f"{name} did not start: " + open(os.path.join(OUT, f"{name}.err")).read()[-400:])
        return None
    return p


def stop(p):
    if p and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def note_markdown():
    """A 7.4 KB note of this project's own making: headings at every level, prose,
    lists, code and a table, the shapes the extractor walks."""
    parts = ["---\ntitle: Scaling bench note\ntags: [bench, scaling]\n---\n"]
    for i in range(1, 13):
        parts.append(f"\n## Part {i}: rolling out the sidecar\n\nThe sidecar sits in front of the "
                     f"gateway and answers the body-free views itself; step {i} checks the "
                     "probes, the metrics and the drain before traffic moves over.\n")
        parts.append(f"\n### Checks for part {i}\n\n- readiness answers 200\n- `/metrics` scrapes\n"
                     f"- the drain finishes within {i * 5} seconds\n")
        if i % 3 == 0:
            parts.append("\n```toml\n[listen]\naddress = \"0.0.0.0:8080\"\n```\n")
        if i % 4 == 0:
            parts.append("\n| key | value |\n|---|---|\n| threads | 2 |\n| drain | 30 s |\n")
        parts.append(f"\n#### Notes on part {i}\n\nKeep the old gateway route until the shadow "
                     "comparison shows no difference for a day.\n")
    return "".join(parts)


tmp = tempfile.mkdtemp(prefix="scaling-")
os.chmod(tmp, 0o755)
body = note_markdown()
with open(f"{tmp}/note.json", "w") as f:
    json.dump({"path": "bench.md", "frontmatter": "{}", "body": body}, f)
context = json.dumps({"actor_sub": "u", "workspace_owner_id": "u", "effective_canister_user_id": "u",
                      "delegating": False, "allowed_vault_ids": ["default"], "scope": None, "role": "viewer"})
up = free_port()
os.makedirs(f"{tmp}/up/logs")
with open(f"{tmp}/up/nginx.conf", "w") as f:
    f.write(f"""worker_processes 4; pid up.pid; error_log stderr crit;
events {{ worker_connections 8192; }}
http {{ access_log off; keepalive_requests 10000000;
  server {{ listen 127.0.0.1:{up} backlog=4096;
    location = /ok {{ default_type text/plain; return 200 "ok"; }}
    location = /api/v1/hosted-context {{ default_type application/json; return 200 '{context}'; }}
    location = /api/v1/notes/bench.md {{ default_type application/json; alias {tmp}/note.json; }}
  }} }}""")
upstream = start([tool("nginx"), "-p", f"{tmp}/up", "-c", f"{tmp}/up/nginx.conf", "-g", "daemon off;"],
                 UP_CORES, "upstream")
model = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": ")
say(f"machine: {NCPU} cpus; {model}; note {len(body)} bytes; sidecars: {SIDECARS}")
results = []


def proxy_nginx(n, port):
    d = f"{tmp}/ng{n}"
    os.makedirs(f"{d}/logs", exist_ok=True)
    with open(f"{d}/nginx.conf", "w") as f:
        f.write(f"""worker_processes {n}; worker_cpu_affinity auto; pid ng.pid; error_log stderr crit;
events {{ worker_connections 8192; }}
http {{ access_log off; keepalive_requests 10000000;
  upstream u {{ server 127.0.0.1:{up}; keepalive 256; }}
  server {{ listen 127.0.0.1:{port} backlog=4096;
    location / {{ proxy_pass http://u; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }}
  }} }}""")
    return [tool("nginx"), "-p", d, "-c", f"{d}/nginx.conf", "-g", "daemon off;"]


def proxy_haproxy(n, port):
    cfg = f"{tmp}/haproxy{n}.cfg"
    with open(cfg, "w") as f:
        f.write(f"""global
  nbthread {n}
  maxconn 4000
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  http-reuse always
frontend f
  bind 127.0.0.1:{port}
  default_backend b
backend b
  server s1 127.0.0.1:{up}
""")
    return [tool("haproxy"), "-f", cfg, "-db"]


def proxy_sidecar(binary):
    def make(n, port):
        cfg = f"{tmp}/sidecar-{n}-{port}.toml"
        with open(cfg, "w") as f:
            f.write(f"""[listen]
address = "127.0.0.1:{port}"
[admin]
address = "127.0.0.1:{free_port()}"
[upstream]
gateway_url = "http://127.0.0.1:{up}"
canister_url = "http://127.0.0.1:{up}"
bridge_url = "http://127.0.0.1:{up}"
[auth]
jwt_secrets = ["{SECRET}"]
require_exp = false
[rate_limit]
per_user_per_minute = 100000000
burst = 100000000
[runtime]
threads = {n}
[log]
access = "none"
level = "error"
""")
        return [binary, "serve", "--config", cfg]
    return make


auth = f"Authorization: Bearer {token('scaling-user')}"
lua = os.path.join(tmp, "users.lua")
with open(lua, "w") as f:
    f.write("local t = {\n" + ",\n".join(f'"Bearer {token(f"scaling-user-{i}")}"' for i in range(USERS)) + "\n}\n")
    f.write("local n = #t\nrequest = function()\n  return wrk.format(nil, nil, {Authorization = t[math.random(n)]})\nend\n")
n0, _, lat0 = wrk(f"http://127.0.0.1:{up}/ok")
say(f"upstream /ok directly: {n0 / SECS:.0f} req/s p50 {lat0.get('50')} p99 {lat0.get('99')}")
proxies = []
if tool("nginx"):
    proxies.append(("nginx", proxy_nginx))
if tool("haproxy"):
    proxies.append(("haproxy", proxy_haproxy))
proxies += [(label, proxy_sidecar(os.path.abspath(path))) for label, path in SIDECARS]
note_url = "/api/v1/section-source?path=bench.md"
for n in SCALE:
    running = {}
    for name, make in proxies:
        port = free_port()
        p = start(make(n, port), span(0, n), f"{name}-{n}")
        if p:
            running[name] = (p, port, make)
    for name, (p, port, make) in running.items():
        if name not in ("nginx", "haproxy"):
            wrk(f"http://127.0.0.1:{port}{note_url}", [auth])  # warm
            wrk(f"http://127.0.0.1:{port}{note_url}", [], lua)  # every user's token remembered
    rounds = {}
    for _ in range(ROUNDS):
        for name, (p, port, make) in running.items():
            cases = [("passthrough", "/ok", [], None)]
            if name == "nginx":
                cases.append(("note-fetch", "/api/v1/notes/bench.md", [], None))
            elif name != "haproxy":
                cases.append(("rest", note_url, [auth], None))
                cases.append((f"rest-{USERS}-users", note_url, [], lua))
            for case, path, headers, script in cases:
                pids = [p.pid] + children(p.pid)
                t0, th0 = ticks(pids), threads(p.pid)
                done, bad, lat = wrk(f"http://127.0.0.1:{port}{path}", headers, script)
                t1, th1 = ticks(pids), threads(p.pid)
                # The profile of the round: each thread's share of the CPU and the
                # context switches (wake-ups, mostly) per request.
                busy = {th1[t][0] + "/" + t: th1[t][1] - th0.get(t, ("", 0, 0))[1] for t in th1}
                total = max(sum(busy.values()), 1)
                shares = sorted((round(v / total, 2) for v in busy.values() if v), reverse=True)
                switches = sum(th1[t][2] - th0.get(t, ("", 0, 0))[2] for t in th1) / max(done, 1)
                rounds.setdefault((name, case), []).append(
                    (done / SECS, (t1 - t0) / TICK / max(done, 1) * 1e6,
                     millis(lat.get("50", "0ms")), millis(lat.get("99", "0ms")), bad, shares, switches))
    for (name, case), runs in rounds.items():
        cpu = sorted(r[1] for r in runs)[len(runs) // 2]
        rps, _, p50, p99, bad, shares, switches = sorted(runs)[len(runs) // 2]
        row = dict(n=n, proxy=name, case=case, rps=round(rps), cpu_us=round(cpu, 1),
                   cpu_us_rounds=[round(r[1], 1) for r in runs], p50_ms=p50, p99_ms=p99, non2xx=bad,
                   thread_cpu_shares=shares, switches_per_request=round(switches, 3))
        results.append(row)
        say(json.dumps(row))
    for p, _, _ in running.values():
        stop(p)

# The parse floor: a bare pulldown-cmark pass over the same note, 5,000 times in one process.
if os.path.exists(PULLDOWN):
    md = os.path.join(tmp, "bench.md")
    with open(md, "w") as f:
        f.write(body)
    manifest = os.path.join(tmp, "floor.tsv")
    with open(manifest, "w") as f:
        f.write("id\tpath\tfile\n" + "".join(f"{i}\tbench.md\t{md}\n" for i in range(5000)))
    import resource
    floor = []
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(["taskset", "-c", "0", PULLDOWN, manifest], stdout=subprocess.DEVNULL, env=ENV)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        floor.append(((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) / 5000 * 1e6)
    row = dict(case="note-parse-floor", cpu_us=round(sorted(floor)[2], 2))
    results.append(row)
    say(json.dumps(row))
stop(upstream)
with open(os.path.join(OUT, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
say("done")
