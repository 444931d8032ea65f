"""Run `rlperf profile --json` on corpus2 scripts and record the advisor's findings against EXPECTED.json.

usage: PYTHONPATH=<wt> python advisor_run.py OUT.json SECTION [script[:FIX] ...]   (no scripts: all 17, slow ones also FIX=1)
"""
import json, os, re, subprocess, sys, time
HERE = os.path.dirname(os.path.abspath(__file__))
C2 = os.path.dirname(HERE)
man = {m["script"]: m for m in json.load(open(os.path.join(C2, "MANIFEST.json")))}
exp = json.load(open(os.path.join(C2, "EXPECTED.json")))
out, section = sys.argv[1], sys.argv[2]
jobs = sys.argv[3:] or [j for s, m in man.items() for j in ([s, s + ":FIX"] if m["kind"] == "slow" else [s])]
res = json.load(open(out)) if os.path.exists(out) else {}
res.setdefault(section, {})

def where_ok(where, m):
    if not where or not m.get("file"):
        return None
    w = re.match(r"(.*?):(\d+)(?: \((.*)\))?", where)
    if not w:
        return None
    f, ln, fn = w.group(1), int(w.group(2)), w.group(3) or ""
    spots = [m] + m.get("also_hot", [])
    for s in spots:
        if f.endswith(s["file"]) and ln == s["line"]:
            return "line"
    for s in spots:
        if f.endswith(s["file"]) and fn and (fn == s["function"] or fn.endswith("." + s["function"]) or s["function"].endswith(fn)):
            return "function"
    return "no"

def summarize(rec, j, name, fix):
    m = man[name]
    fs = ((j.get("profile") or {}).get("advisor") or {}).get("findings") or []
    rec["findings"] = [{"id": f["id"], "est_saving_s": f.get("est_saving_s"), "where": f.get("where")} for f in fs]
    ids = [f["id"] for f in fs]
    if m["kind"] == "slow" and not fix:
        ok = exp[name]["ids"]
        first = next((f for f in fs if f["id"] in ok), None)
        rec["expected"] = ok
        rec["named_first"] = bool(ids) and ids[0] in ok
        rec["named_anywhere"] = first is not None
        rec["where"] = first.get("where") if first else None
        rec["where_match"] = where_ok(rec["where"], m) if first else None
        rec["other_findings"] = [i for i in ids if i not in ok]
    else:
        rec["false_alarms"] = ids
    rec["script_wall_s"] = (j.get("script") or {}).get("wall_s")
    rec["cpu_wait"] = (j.get("profile") or {}).get("cpu_wait")


if len(sys.argv) > 3 and sys.argv[3] == "--resummarize":
    for job, rec in res[section].items():
        name, fix = (job[:-4], True) if job.endswith(":FIX") else (job, False)
        f = os.path.join(HERE, "records", f"{section}__{name}{'__FIX' if fix else ''}.json")
        if os.path.exists(f):
            summarize(rec, json.load(open(f)), name, fix)
    json.dump(res, open(out, "w"), indent=1)
    sys.exit(0)

for job in jobs:
    name, fix = (job[:-4], True) if job.endswith(":FIX") else (job, False)
    m = man[name]
    env = dict(os.environ, FIX="1" if fix else "0")
    la0 = os.getloadavg()
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "rlperf", "profile", "--json", "--", sys.executable, name], cwd=C2,
                       env=env, capture_output=True, text=True, timeout=400)
    wall = time.perf_counter() - t
    la1 = os.getloadavg()
    rec = {"script": name, "fix": fix, "kind": m["kind"], "rc": p.returncode, "wall_s": round(wall, 1),
           "loadavg_start": la0, "loadavg_end": la1}
    try:
        j = json.loads(p.stdout)
    except Exception:
        rec["error"] = (p.stdout[-1500:] + p.stderr[-1500:])
        j = None
    if j is not None:
        with open(os.path.join(HERE, "records", f"{section}__{name}{'__FIX' if fix else ''}.json"), "w") as fh:
            json.dump(j, fh, indent=1)
        summarize(rec, j, name, fix)
    res[section][job] = rec
    json.dump(res, open(out, "w"), indent=1)
    print(job, rec.get("rc"), rec.get("wall_s"), [(f["id"], f["est_saving_s"], f["where"]) for f in rec.get("findings", [])],
          rec.get("error", "")[-300:], flush=True)
