"""The before/after table of advisor_main.json (a where that is the loop's call of the manifest function counts as its call site)."""
import json, os, pstats, re, sys
os.chdir("/work/wt39b/tests/foreign/corpus2")
man = {m["script"]: m for m in json.load(open("MANIFEST.json"))}
d = json.load(open("_measure/advisor_main.json"))
def calls_into(section, name, where, m):
    """whether where's function reaches the manifest function (or an also_hot one) within 4 user calls: the loop's call site"""
    f = f"_measure/records/{section}__{name}.json"
    if not where or not os.path.exists(f): return False
    st = pstats.Stats(os.path.join(json.load(open(f))["run_dir"], "profile.prof")).stats
    w = re.match(r"(.*?):(\d+) \((.*)\)", where); wf, wfn = w.group(1), w.group(3)
    targets = {s["function"].split(".")[-1] for s in [m] + m.get("also_hot", [])}
    callees = {}
    for k, v in st.items():
        for c in v[4]: callees.setdefault(c, []).append(k)
    front = [k for k in st if k[2] == wfn and k[0].endswith(wf)]
    for _ in range(4):
        nxt = [k for f in front for k in callees.get(f, [])]
        if any(k[2] in targets for k in nxt): return True
        front = nxt
    return False
rows = []
for sec in ("before", "after"):
    if sec not in d: continue
    for job, r in d[sec].items():
        if r.get("fix") or r["kind"] == "clean": continue
        m = man[r["script"]]
        wm = r.get("where_match")
        if wm == "no" and calls_into(sec, r["script"], r.get("where"), m): wm = "loop call site"
        fa = d[sec].get(job + ":FIX", {}).get("false_alarms")
        rows.append((sec, r["script"], "/".join(r["expected"]), r.get("named_first"), r.get("named_anywhere"), r.get("where"), wm,
                     ",".join(f["id"] for f in r.get("findings", [])) or "-", ",".join(fa) if fa else "-"))
    for job, r in d[sec].items():
        if r["kind"] == "clean":
            rows.append((sec, r["script"], "(clean)", "", "", "", "", ",".join(r.get("false_alarms") or []) or "-", ""))
print("| run | script | expected | first | anywhere | where (first matching) | line | all findings | FIX=1 findings |")
print("|---|---|---|---|---|---|---|---|---|")
for row in rows: print("| " + " | ".join(str(x) for x in row) + " |")
