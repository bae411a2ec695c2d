import sys,glob
for d in sys.argv[1:]:
    f=glob.glob(d+'/srv-*.log')
    if not f: print(d,'no srv log'); continue
    rows=[l.split() for l in open(f[0])]
    wall=sorted(float(r[2]) for r in rows); cpu=sorted(float(r[4]) for r in rows); oth=[int(r[6]) for r in rows]
    top=sorted(rows,key=lambda r:-float(r[2]))[:4]
    print(d.split('/')[-1], f'srv wall p50 {wall[len(wall)//2]:.1f} max {wall[-1]:.1f} | cpu p50 {cpu[len(cpu)//2]:.1f} mean {sum(cpu)/len(cpu):.1f} | others mean {sum(oth)/len(oth):.1f} |top wall/cpu/others', [(r[2],r[4],r[6]) for r in top])
