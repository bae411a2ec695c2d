import sys, glob, re
d = sys.argv[1]
procs = {}
for f in glob.glob(d + '/gc-*.log'):
    lines = open(f).read().splitlines()
    name = lines[0]
    tag = 'cp' if ' control ' in name else 'bench' if 'bench/dist/src/main.js' in name else 'edges' if 'simulated' in name else 'other'
    ev = []
    for l in lines[1:]:
        if l.startswith('#'): continue
        t, k, dur = l.split(); ev.append((float(t), k, float(dur)))
    procs[tag] = ev
reqs = []
for f in glob.glob(d + '/req-*.log'):
    for l in open(f):
        p = l.split(); reqs.append((float(p[0]), float(p[2]), float(p[4]), float(p[6]), float(p[8]), 0) if p[4][0]!='-' else (float(p[0]), float(p[2]), 0.0, float(p[10])-float(p[0])-float(p[2]), float(p[10])-float(p[0]), 0))
pages = [(float(l.split()[0]), float(l.split()[2])) for l in open(d + '/pages.log')]
thr = float(sys.argv[2]) if len(sys.argv) > 2 else 0
print('client_ms  srv_total handler ser write bytes | gc overlapping (proc kind dur)')
for t0, ms in pages:
    r = min(reqs, key=lambda r: abs(r[0] - t0)) if reqs else None
    gcs = []
    for tag, ev in procs.items():
        if tag not in ('cp', 'bench', 'edges'): continue
        for (t, k, dur) in ev:
            if t + dur >= t0 and t <= t0 + ms and (k == 'major' or dur > 2):
                gcs.append(f'{tag}:{k}:{dur:.1f}@{t - t0:+.0f}')
    if ms >= thr:
        print(f'{ms:7.2f}  {r[4]:7.2f} {r[1]:6.2f} {r[2]:6.2f} {r[3]:6.2f} {r[5]} | ' + ' '.join(gcs))
