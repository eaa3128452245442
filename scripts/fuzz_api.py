#!/usr/bin/env python3
"""Helper of scripts/fuzz-api (standard library only).

setup           creates the fuzz identities on a fresh server as its platform admin and prints them as shell
                assignments: a tenant `fuzz-team`, a user `fuzz-member` with the `member` role in it and an API token
                of that user, and with `node` a node credential of the demo node `demo-node-2`
check-identity  fails when an identity's credential no longer works (a run must not lose it half way)
summarize       reads a run's schemathesis reports (report.json, events.ndjson), prints its counts and writes
                failures.txt: every distinct failure with a curl reproduction and the response
"""

from __future__ import annotations

import argparse
import base64
import collections
import http.cookiejar
import json
import os
import secrets
import shlex
import string
import sys
import time
import urllib.error
import urllib.request

TENANT = "fuzz-team"
MEMBER = "fuzz-member"
NODE = "demo-node-2"


class Api:
    def __init__(self, base: str, token: str | None = None):
        self.base = base.rstrip("/")
        self.token = token
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def call(self, method: str, path: str, body=None, headers=None, ok=(200, 201, 204)):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with self.opener.open(req, timeout=30) as resp:
                status, text = resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode(errors="replace")
        if status not in ok:
            raise SystemExit(f"fuzz-api setup: {method} {path} -> {status}: {text[:500]}")
        return json.loads(text) if text.strip() else None


def wait_for_demo(admin: Api) -> None:
    """The demo seeds tenants `vision` and `llm-serving` once both simulated nodes reported their GPUs; waiting keeps
    that seeding from racing the fuzz (and gives the fuzz GPUs, layouts, requests and allocations to work on)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        tenants = {t["name"] for t in admin.call("GET", "/api/v1/tenants")}
        nodes = admin.call("GET", "/api/v1/nodes")
        gpus = sum(len(n.get("gpus") or []) for n in nodes)
        if {"vision", "llm-serving"} <= tenants and len(nodes) >= 2 and gpus > 0:
            return
        time.sleep(0.5)
    raise SystemExit("fuzz-api setup: the demo did not seed its nodes and tenants within 90 s")


def setup(args) -> None:
    admin = Api(args.url, args.admin_token)
    if args.wait_demo:
        wait_for_demo(admin)
    env = {}
    tenant = admin.call(
        "POST", "/api/v1/tenants", {"name": TENANT, "auto_approve": True, "auto_approve_max_compute_slices": 14}
    )
    env["FUZZ_TENANT_ID"] = tenant["id"]
    if "member" in args.identities:
        user = admin.call("POST", "/api/v1/users", {"name": MEMBER})
        env["FUZZ_MEMBER_ID"] = user["id"]
        admin.call("PUT", f"/api/v1/tenants/{tenant['id']}/members/{user['id']}", {"role": "member"})
        # API tokens are created only by their owner: the admin sets a local password, the member signs in with it
        # (a session cookie and its CSRF token) and creates a token for itself.
        alphabet = string.ascii_letters + string.digits
        password = "".join(secrets.choice(alphabet) for _ in range(32))
        admin.call("PUT", f"/api/v1/users/{user['id']}/password", {"password": password})
        member = Api(args.url)
        session = member.call("POST", "/auth/local", {"name": MEMBER, "password": password})
        created = member.call(
            "POST", "/api/v1/tokens", {"name": "fuzz"}, headers={"X-CSRF-Token": session["csrf_token"]}
        )
        env["FUZZ_MEMBER_TOKEN"] = created["secret"]
        me = Api(args.url, created["secret"]).call("GET", "/api/v1/session")
        roles = {m["tenant"]: m["role"] for m in me["memberships"]}
        if me["user"]["platform_admin"] or roles != {tenant["id"]: "member"}:
            raise SystemExit(f"fuzz-api setup: the member token is not a plain tenant member: {me}")
    if "node" in args.identities:
        nodes = {n["name"]: n for n in admin.call("GET", "/api/v1/nodes")}
        if NODE not in nodes:
            raise SystemExit(f"fuzz-api setup: no node {NODE} (the node identity needs --demo)")
        cred = admin.call("POST", f"/api/v1/nodes/{nodes[NODE]['id']}/credentials")
        env["FUZZ_NODE_ID"] = nodes[NODE]["id"]
        env["FUZZ_NODE_TOKEN"] = cred["secret"]
    for k, v in env.items():
        print(f"{k}={shlex.quote(v)}")


def check_identity(args) -> None:
    path = "/api/v1/agent/node" if args.identity == "node" else "/api/v1/session"
    req = urllib.request.Request(args.url.rstrip("/") + path, headers={"Authorization": f"Bearer {args.token}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status = resp.status
    except urllib.error.HTTPError as e:
        status = e.code
    except OSError as e:
        status = str(e)
    if status != 200:
        print(f"fuzz-api: the {args.identity} credential stopped working during its run (GET {path} -> {status}); "
              "cases after that point tested nothing", file=sys.stderr)
        sys.exit(1)


def decode(content) -> str:
    if content is None:
        return ""
    if isinstance(content, dict) and "$base64" in content:
        raw = base64.b64decode(content["$base64"])
    elif isinstance(content, dict) and "string" in content:
        raw = content["string"].encode()
    elif isinstance(content, str):
        raw = content.encode()
    else:
        return json.dumps(content)
    return raw.decode("utf-8", errors="backslashreplace")


def shq(text: str) -> str:
    """Shell quoting that keeps control and non-ASCII characters visible: $'...' with escapes where needed."""
    if text.isprintable() and text.isascii():
        return shlex.quote(text)
    out = []
    for ch in text:
        if ch in "\\'":
            out.append("\\" + ch)
        elif ch.isascii() and ch.isprintable():
            out.append(ch)
        else:
            out.append("".join(f"\\x{b:02x}" for b in ch.encode("utf-8", errors="surrogatepass")))
    return "$'" + "".join(out) + "'"


def visible(text: str) -> str:
    """Text for the report: control characters escaped."""
    return "".join(ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode() for ch in text)


def curl(request: dict) -> str:
    """A shell command repeating the request; the filtered credential becomes `$TOKEN`."""
    parts = ["curl", "-i", "-X", request.get("method", "GET")]
    for name, values in (request.get("headers") or {}).items():
        if name.lower() in ("user-agent", "accept-encoding", "accept", "connection", "content-length"):
            continue
        for value in values if isinstance(values, list) else [values]:
            if name.lower() == "authorization" and value == "[Filtered]":
                parts += ["-H", '"Authorization: Bearer $TOKEN"']
            else:
                parts += ["-H", shq(f"{name}: {value}")]
    body = request.get("body")
    if body is not None:
        parts += ["--data-binary", shq(decode(body))]
    parts.append(shq(request["uri"]))
    return " ".join(parts)


def summarize(args) -> None:
    path = os.path.join(args.dir, "report.json")
    report = json.load(open(path)) if os.path.exists(path) else {}
    distinct = collections.OrderedDict()  # (check, operation, title, message) -> interaction
    cases_by_check = collections.Counter()
    errors = []
    try:
        lines = open(f"{args.dir}/events.ndjson")
    except OSError:
        lines = []
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a run cut off by `timeout` may leave a partial last line
        scenario = event.get("ScenarioFinished")
        if not scenario:
            if "NonFatalError" in event:
                errors.append(event["NonFatalError"])
            continue
        recorder = scenario.get("recorder") or {}
        label = recorder.get("label", "?")
        for case_id, checks in (recorder.get("checks") or {}).items():
            interaction = (recorder.get("interactions") or {}).get(case_id)
            for check in checks:
                if check.get("status") != "failure":
                    continue
                failure = (check.get("failure_info") or {}).get("failure") or {}
                cases_by_check[check["name"]] += 1
                key = (check["name"], failure.get("operation", label), failure.get("title", ""),
                       failure.get("message", "").strip())
                distinct.setdefault(key, interaction)
    by_check = collections.Counter(k[0] for k in distinct)
    ops = report.get("operations", {})
    tc = report.get("test_cases", {})
    report_errors = report.get("errors") or []
    # CPython 3.11 before 3.11.8 (this machine's Pythons are 3.11.2 and 3.11.7) can raise this SystemError from
    # ast.parse while Hypothesis describes one of schemathesis' own filter lambdas (CPython gh-106905): a crash of
    # the test tool while it builds cases, before any request. Those errors are counted apart and fail nothing;
    # every other error (network failures, timeouts, any other tool error) still fails the run.
    tool_bug = "AST constructor recursion depth mismatch"
    known = [e for e in errors if tool_bug in json.dumps(e)]
    errors = [e for e in errors if tool_bug not in json.dumps(e)]
    # The report counts errors by title only; the known ones are among its runtime errors.
    reported = sum(int(e.get("count", 1)) if isinstance(e, dict) else 1 for e in report_errors)
    report_errors = ["error"] * max(reported - len(known), 0)
    errored = max((tc.get("errored") or 0) - len(known), 0)
    exit_code = 0 if args.exit_code == 1 and known and not distinct and not errors and not report_errors \
        and not errored else args.exit_code
    lines_out = [
        f"[{args.identity}] {args.seconds} s, schemathesis exit {args.exit_code}"
        + (" (TIMED OUT: stopped at --time-limit)" if args.exit_code in (124, 137) else "")
        + ("" if report.get("complete", False) else " (run INCOMPLETE: cut off or crashed)")
        + (f", stop reason {report.get('stop_reason')}" if report.get("stop_reason") not in (None, "completed") else ""),
        f"  operations: {ops.get('tested', '?')} tested of {ops.get('selected', '?')} selected "
        f"({ops.get('total', '?')} in the document), {ops.get('errored', 0)} errored",
        f"  test cases: {tc.get('generated', '?')} generated, {tc.get('with_failures', '?')} with failures, "
        f"{tc.get('errored', 0)} errored; seed {report.get('seed', '?')}",
        f"  distinct failures: {len(distinct)}" + ("" if distinct else " (every check passed)"),
    ]
    for check, n in sorted(by_check.items(), key=lambda kv: -kv[1]):
        ops_hit = len({k[1] for k in distinct if k[0] == check})
        lines_out.append(f"    {check}: {n} distinct in {ops_hit} operations ({cases_by_check[check]} failing cases)")
    if report_errors or errors or errored:
        lines_out.append(
            f"  errors (network failures, timeouts, schemathesis errors): "
            f"{max(len(report_errors), len(errors), errored)} (see schemathesis.txt)"
        )
    if known:
        lines_out.append(f"  not counted: {len(known)} schemathesis crash(es) on CPython gh-106905 (see schemathesis.txt)")
    if args.identity_alive != "yes":
        lines_out.append("  the credential stopped working during the run")
    print("\n".join(lines_out))

    with open(f"{args.dir}/failures.txt", "w") as f:
        f.write(f"# {args.identity}: {len(distinct)} distinct failures; $TOKEN is this identity's API token\n")
        for (check, operation, title, message), interaction in sorted(distinct.items(), key=lambda kv: kv[0][:2]):
            f.write(f"\n## {operation} — {check}: {title}\n")
            if message:
                f.write("   " + visible(message).replace("\\n", "\n   ") + "\n")
            if interaction:
                req, resp = interaction.get("request") or {}, interaction.get("response") or {}
                f.write(f"   {curl(req)}\n")
                if resp:
                    ctype = ", ".join((resp.get("headers") or {}).get("content-type", [])) or "-"
                    body = decode(resp.get("content"))
                    body = body if len(body) <= 600 else body[:600] + "…"
                    f.write(f"   -> {resp.get('status_code')} {ctype} {visible(body)}\n")
    failed = (
        bool(distinct) or exit_code != 0 or not report.get("complete", False) or bool(report_errors)
        or bool(errors) or bool(errored) or args.identity_alive != "yes"
    )
    sys.exit(1 if failed else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("setup")
    p.add_argument("--url", required=True)
    p.add_argument("--admin-token", required=True)
    p.add_argument("--wait-demo", action="store_true")
    p.add_argument("identities", nargs="*", default=["member", "admin"])
    p = sub.add_parser("check-identity")
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--identity", required=True)
    p = sub.add_parser("summarize")
    p.add_argument("--dir", required=True)
    p.add_argument("--identity", required=True)
    p.add_argument("--exit-code", type=int, required=True)
    p.add_argument("--seconds", type=int, required=True)
    p.add_argument("--identity-alive", default="yes")
    args = parser.parse_args()
    {"setup": setup, "check-identity": check_identity, "summarize": summarize}[args.cmd](args)


if __name__ == "__main__":
    main()
