#!/usr/bin/env python3
"""Reads a rendered manifest (kubectl kustomize output) for deploy/kubernetes/check.

    pod.py materialize RENDERED ROOTFS SECRETS
        Writes what the sidecar container sees through its volumes into ROOTFS (an image
        root filesystem): ConfigMaps from the render, Secrets from the render or, when
        the render has none (they are created outside kustomize), from
        SECRETS/<secret name>/<key>; modes and the fsGroup as the kubelet sets them.
        Prints the container's view as lines for the shell:
            ARG <arg>            the container's args, in order
            ENV <NAME>=<value>   its literal environment
            EMPTYDIR <path>      its emptyDir mount (exactly one)
            FSGROUP <gid>
    pod.py gateway RENDERED OUT
        Writes the gateway's ConfigMap volumes under OUT/<mountPath> and prints its
        literal environment as ENV lines.
    pod.py policy RENDERED EFFECTIVE_TOML GATEWAY_DRAIN_SECONDS
        Checks the render against the rules deploy/README.md states, using the sidecar's
        effective configuration (check-config's output); prints PASS/FAIL lines and exits
        1 if any failed.
"""

import base64
import os
import sys
import tomllib

import yaml

SIDECAR, GATEWAY = "sidecar", "gateway"
MIB = 1024 * 1024
KIB = 1024
# Resident memory besides connections, requests at the gateway and buffered request
# bodies, rounded up from docs/benchmarks.md (61.4 MiB peak with 24 MiB buffered, flood 4;
# 22.4 MiB peak under load).
BASELINE_BYTES = 64 * MIB
# An open connection idle after a request (35.6 KiB measured), and what a request at the
# gateway adds to it (15 KiB on HTTP/1, 34 KiB for an HTTP/2 stream), rounded up
# (deploy/README.md, "Sizing").
CONNECTION_BYTES = 36 * KIB
FORWARDED_BYTES = 36 * KIB
# An MCP session the sidecar has learned (20,000 took 27.2 MiB, about 1.4 KiB each, with
# the caches their users filled), rounded up.
SESSION_BYTES = 1536


def load(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    if len(found) != 1:
        sys.exit(f"pod.py: expected one {kind} {name or ''}, found {len(found)}")
    return found[0]


def pod_spec(docs):
    return one(docs, "Deployment")["spec"]["template"]["spec"]


def container(spec, name):
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        if c["name"] == name:
            return c
    sys.exit(f"pod.py: no container {name}")


def volume(spec, name):
    for v in spec.get("volumes", []):
        if v["name"] == name:
            return v
    sys.exit(f"pod.py: no volume {name}")


def literal_env(c):
    out = []
    for e in c.get("env", []):
        if "value" not in e:
            sys.exit(f"pod.py: env {e['name']} of {c['name']} is not a literal value")
        out.append(f"ENV {e['name']}={e['value']}")
    return out


def write_files(dest, files, mode, gid):
    os.makedirs(dest, exist_ok=True)
    for key, data in files.items():
        path = os.path.join(dest, key)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, mode)
        os.chown(path, 0, gid)


def volume_files(docs, vol, secrets_dir):
    """(files, default mode) of a configMap or secret volume."""
    if "configMap" in vol:
        cm = one(docs, "ConfigMap", vol["configMap"]["name"])
        files = {k: v.encode() for k, v in cm.get("data", {}).items()}
        return files, vol["configMap"].get("defaultMode", 0o644)
    if "secret" in vol:
        name = vol["secret"]["secretName"]
        rendered = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == name]
        if rendered:
            files = {k: base64.b64decode(v) for k, v in rendered[0].get("data", {}).items()}
            files.update({k: v.encode() for k, v in rendered[0].get("stringData", {}).items()})
        else:
            src = os.path.join(secrets_dir, name)
            if not os.path.isdir(src):
                sys.exit(f"pod.py: Secret {name} is not rendered and {src} does not exist")
            files = {}
            for key in sorted(os.listdir(src)):
                with open(os.path.join(src, key), "rb") as f:
                    files[key] = f.read()
        return files, vol["secret"].get("defaultMode", 0o644)
    return None, None


def cmd_materialize(rendered, rootfs, secrets_dir):
    docs = load(rendered)
    spec = pod_spec(docs)
    gid = spec.get("securityContext", {}).get("fsGroup", 0)
    c = container(spec, SIDECAR)
    empty = []
    for m in c.get("volumeMounts", []):
        vol = volume(spec, m["name"])
        if "emptyDir" in vol:
            empty.append(m["mountPath"])
            os.makedirs(rootfs + m["mountPath"], exist_ok=True)
            continue
        files, mode = volume_files(docs, vol, secrets_dir)
        if files is None:
            sys.exit(f"pod.py: volume {m['name']}: only configMap, secret and emptyDir are handled")
        write_files(rootfs + m["mountPath"], files, mode, gid)
    if len(empty) != 1:
        sys.exit(f"pod.py: expected one emptyDir in the sidecar, found {len(empty)}")
    for a in c.get("args", []):
        print(f"ARG {a}")
    for line in literal_env(c):
        print(line)
    print(f"EMPTYDIR {empty[0]}")
    print(f"FSGROUP {gid}")


def cmd_gateway(rendered, out):
    docs = load(rendered)
    spec = pod_spec(docs)
    c = container(spec, GATEWAY)
    for m in c.get("volumeMounts", []):
        vol = volume(spec, m["name"])
        if "configMap" in vol:
            files, _ = volume_files(docs, vol, None)
            write_files(out + m["mountPath"], files, 0o644, 0)
    for line in literal_env(c):
        print(line)


class Checker:
    def __init__(self):
        self.failed = 0

    def check(self, ok, what, detail=""):
        if ok:
            print(f"PASS policy: {what}")
        else:
            self.failed += 1
            print(f"FAIL policy: {what}{': ' + detail if detail else ''}")


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def resolve_port(c, port):
    if isinstance(port, int):
        return port
    for p in c.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    return None


def mib(quantity):
    units = {"Ki": 1024, "Mi": MIB, "Gi": 1024 * MIB}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    return int(quantity)


def cmd_policy(rendered, effective_toml, gateway_drain):
    docs = load(rendered)
    with open(effective_toml, "rb") as f:
        cfg = tomllib.load(f)
    deploy = one(docs, "Deployment")
    spec = deploy["spec"]["template"]["spec"]
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    ann = deploy["spec"]["template"]["metadata"].get("annotations", {})
    ck = Checker()
    side, gw = container(spec, SIDECAR), container(spec, GATEWAY)
    listen_port, admin_port = port_of(cfg["listen"]["address"]), port_of(cfg["admin"]["address"])
    gw_url = cfg["upstream"]["gateway_url"]
    gw_port = int(gw_url.rsplit(":", 1)[1].split("/")[0])

    ck.check(any(c["name"] == SIDECAR for c in spec.get("initContainers", []))
             and side.get("restartPolicy") == "Always",
             "the sidecar is a native sidecar (initContainers, restartPolicy: Always)")
    ck.check(any(c["name"] == GATEWAY for c in spec.get("containers", [])), "the gateway is the main container")

    # Pod Security "restricted", plus a read-only root everywhere.
    psc = spec.get("securityContext", {})
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        sc = c.get("securityContext", {})
        eff = lambda k: sc.get(k, psc.get(k))
        problems = []
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append("allowPrivilegeEscalation")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []) or sc.get("capabilities", {}).get("add"):
            problems.append("capabilities")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append("readOnlyRootFilesystem")
        if sc.get("privileged"):
            problems.append("privileged")
        if eff("runAsNonRoot") is not True or eff("runAsUser") in (None, 0):
            problems.append("runAsNonRoot/runAsUser")
        if (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problems.append("seccompProfile")
        ck.check(not problems, f"{c['name']}: restricted security context, read-only root", ", ".join(problems))
    ck.check(not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
             and not any("hostPath" in v for v in spec.get("volumes", [])),
             "no host namespaces or hostPath volumes")
    ns = [d for d in docs if d["kind"] == "Namespace"]
    ck.check(all(n["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce") == "restricted" for n in ns),
             "namespace enforces Pod Security restricted")
    ck.check(spec.get("automountServiceAccountToken") is False, "no service account token mounted")
    ck.check(spec.get("enableServiceLinks") is False,
             "enableServiceLinks: false (no KNOWTATION_SIDECAR_* service variables)")

    # Probes on the admin port; startup on /live (readiness needs the gateway, which
    # starts only after the sidecar's startup probe passes).
    for probe, path in (("startupProbe", "/live"), ("livenessProbe", "/live"), ("readinessProbe", "/ready")):
        p = side.get(probe, {}).get("httpGet", {})
        ck.check(p.get("path") == path and resolve_port(side, p.get("port")) == admin_port
                 and p.get("scheme", "HTTP") == "HTTP",
                 f"sidecar {probe}: GET {path} on the admin port {admin_port}", str(p))
    ck.check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == str(admin_port)
             and ann.get("prometheus.io/path") == "/metrics",
             f"Prometheus annotations scrape port {admin_port} /metrics")
    ck.check(not gw.get("ports") and not any(k in gw for k in ("livenessProbe", "readinessProbe", "startupProbe")),
             "the gateway declares no port and no probe (it is reachable on loopback only)")
    ck.check({p["containerPort"] for p in side.get("ports", [])} == {listen_port, admin_port},
             f"sidecar ports are the configured listen ({listen_port}) and admin ({admin_port}) ports")

    # The gateway: on loopback, at the port the sidecar's gateway_url names.
    genv = {e["name"]: e.get("value") for e in gw.get("env", [])}
    ck.check(gw_url.startswith("http://127.0.0.1:") and genv.get("GATEWAY_PORT") == str(gw_port),
             f"gateway_url {gw_url} matches GATEWAY_PORT={genv.get('GATEWAY_PORT')}")
    preload = (genv.get("NODE_OPTIONS") or "").split("--require=", 1)[-1].split()[0] if "--require=" in (genv.get("NODE_OPTIONS") or "") else None
    mounted = False
    for m in gw.get("volumeMounts", []):
        vol = volume(spec, m["name"])
        if preload and "configMap" in vol and preload.startswith(m["mountPath"].rstrip("/") + "/"):
            cm = one(docs, "ConfigMap", vol["configMap"]["name"])
            mounted = os.path.basename(preload) in cm.get("data", {})
    ck.check(mounted, f"the gateway preloads {preload} from a mounted ConfigMap")

    # Service and NetworkPolicy: only the sidecar's ports.
    for svc in [d for d in docs if d["kind"] == "Service"]:
        ok = svc["spec"]["selector"].items() <= labels.items()
        targets = [resolve_port(side, p.get("targetPort", p["port"])) for p in svc["spec"]["ports"]]
        ck.check(ok and targets == [listen_port],
                 f"Service {svc['metadata']['name']} selects the pod and targets only the proxy port {listen_port}",
                 f"targets {targets}")
    for np in [d for d in docs if d["kind"] == "NetworkPolicy"]:
        ok = np["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        allowed = {}
        for rule in np["spec"].get("ingress", []):
            for p in rule.get("ports", []):
                allowed.setdefault(p["port"], []).append(rule.get("from"))
        admin_from = allowed.get(admin_port, [])
        ck.check(ok and set(allowed) == {listen_port, admin_port}
                 and all(f and all("namespaceSelector" in x and "podSelector" not in x and "ipBlock" not in x for x in f)
                         for f in admin_from),
                 f"NetworkPolicy {np['metadata']['name']}: proxy port open, admin port from a namespace selector only, "
                 f"nothing else (not {gw_port})", str(allowed))
    pdb = one(docs, "PodDisruptionBudget")
    ck.check(pdb["spec"]["selector"]["matchLabels"].items() <= labels.items(), "PodDisruptionBudget selects the pod")

    # Shutdown: the gateway (preStop, then its own drain) first, the sidecar after.
    pre = gw.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace, drain = cfg["shutdown"]["grace_seconds"], cfg["shutdown"]["drain_seconds"]
    need = pre + gateway_drain + grace + drain + 5
    tgps = spec.get("terminationGracePeriodSeconds", 30)
    ck.check(tgps >= need, f"terminationGracePeriodSeconds {tgps} >= gateway preStop {pre} + gateway drain "
             f"{gateway_drain} + sidecar grace {grace} + drain {drain} + margin 5 = {need}")

    # Memory: everything the configuration allows at once must fit under the limit.
    limit = side.get("resources", {}).get("limits", {}).get("memory")
    listen = cfg["listen"]
    buffered = listen["max_buffered_bytes"]
    conns = listen["max_connections"] * CONNECTION_BYTES
    at_gateway = listen["max_forwarded_in_flight"] + listen["max_forwarded_in_flight_anonymous"]
    forwarded = at_gateway * FORWARDED_BYTES
    sessions = cfg["mcp"]["max_sessions"] * SESSION_BYTES
    need = buffered + conns + forwarded + sessions + BASELINE_BYTES
    ck.check(limit is not None and mib(limit) >= need,
             f"sidecar memory limit {limit} >= listen.max_buffered_bytes {buffered // MIB} MiB + "
             f"{listen['max_connections']} connections {conns // MIB} MiB + "
             f"{at_gateway} requests at the gateway {forwarded // MIB} MiB + "
             f"{cfg['mcp']['max_sessions']} MCP sessions {sessions // MIB} MiB + baseline "
             f"{BASELINE_BYTES // MIB} MiB = {need // MIB} MiB")
    req = side.get("resources", {}).get("requests", {})
    ck.check("cpu" in req and "memory" in req and mib(req["memory"]) <= mib(limit or "0"),
             "sidecar requests cpu and memory, request <= limit")

    # State on the emptyDir.
    state = cfg.get("state", {}).get("directory", "")
    on_empty = any(state == m["mountPath"] or state.startswith(m["mountPath"].rstrip("/") + "/")
                   for m in side.get("volumeMounts", []) if "emptyDir" in volume(spec, m["name"]))
    ck.check(on_empty, f"state.directory {state} is on an emptyDir")
    sys.exit(1 if ck.failed else 0)


def main(argv):
    table = {"materialize": (cmd_materialize, 3), "gateway": (cmd_gateway, 2), "policy": (cmd_policy, 3)}
    if len(argv) < 2 or argv[1] not in table or len(argv) - 2 != table[argv[1]][1]:
        sys.exit(__doc__)
    args = argv[2:]
    if argv[1] == "policy":
        args[2] = int(args[2])
    table[argv[1]][0](*args)


if __name__ == "__main__":
    main(sys.argv)
