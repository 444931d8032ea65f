import json, os, subprocess, sys, time, resource, statistics
root = "/work/corpus2"
scripts = sys.argv[2:]
out = sys.argv[1]
res = json.load(open(out)) if os.path.exists(out) else {}
for s in scripts:
    modes = ["0", "1"] if not s.startswith("clean:") else ["0"]
    name = s.replace("clean:", "")
    r = {m: {"wall": [], "cpu": []} for m in modes}
    for rep in range(3):
        for m in modes:
            env = dict(os.environ, FIX=m)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            p = subprocess.run([sys.executable, name], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            w = time.perf_counter() - t
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            r[m]["wall"].append(round(w, 2)); r[m]["cpu"].append(round(cpu, 2))
            if p.returncode != 0:
                r[m]["error"] = p.stdout[-2000:]
            r[m]["last_out"] = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    r["load"] = os.getloadavg()[0]
    res[name] = r
    json.dump(res, open(out, "w"), indent=1)
    med = {m: statistics.median(r[m]["wall"]) for m in modes}
    print(name, med, {m: statistics.median(r[m]["cpu"]) for m in modes}, flush=True)
