import sys,glob
d=sys.argv[1]
rows=[l.split() for f in glob.glob(d+'/req-*.log') for l in open(f)]
rows=[r if r[4][0]!='-' else [r[0],'h',r[2],'s','0','w',str(float(r[10])-float(r[0])-float(r[2])),'t',str(float(r[10])-float(r[0]))] for r in rows]
c=sorted(float(l.split()[2]) for l in open(d+'/pages.log'))
out=[]
for name,i in (('handler',2),('ser',4),('write',6),('srv',8)):
    v=sorted(float(r[i]) for r in rows); out.append(f'{name} p50 {v[len(v)//2]:.1f} max {v[-1]:.1f}')
print(' | '.join(out)); print(f'client p50 {c[len(c)//2]:.1f} top3 {c[-1]:.1f} {c[-2]:.1f} {c[-3]:.1f}')
# gc in cp during pages window
pages=[(float(l.split()[0]), float(l.split()[2])) for l in open(d+'/pages.log')]
s=pages[0][0]; e=pages[-1][0]+pages[-1][1]
for f in glob.glob(d+'/gc-*.log'):
    L=open(f).read().splitlines(); tag='cp' if ' control ' in L[0] else 'bench' if 'bench/dist/src/main.js' in L[0] else 'edges' if 'simulated' in L[0] else None
    if not tag: continue
    ev=[x.split() for x in L[1:] if not x.startswith('#')]
    ev=[(float(a),k,float(b)) for a,k,b in ev if s-50<=float(a)<=e]
    byk={}
    for t,k,dur in ev: byk.setdefault(k,[]).append(dur)
    print(tag, {k:(len(v), round(sum(v),1), round(max(v),1)) for k,v in byk.items()}, f'window {e-s:.0f} ms')
