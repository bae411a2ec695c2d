import sys, statistics
tr=[l.split() for l in open('/tmp/x32/trace.txt')]
tr=[(int(p),t,int(ns)) for p,t,ns in tr]
tr.sort(key=lambda x:x[2])
spawn_pid=[p for p,t,ns in tr if t=='S_start']
segs=[];cur=None
for p,t,ns in tr:
    if t=='S0_request':
        cur={};segs.append(cur)
    if cur is None: continue
    if t not in cur: cur[t]=ns
nd=[l.split() for l in open('/tmp/x32/node.txt')]
recs=[];r=None
for _,t,ns in nd:
    if t=='a': r={};recs.append(r)
    r[t]=int(ns)
segs=segs[-len(recs):]
for s,r in zip(segs,recs):
    for k,v in r.items(): s['N.'+k]=v
order=['N.a','N.ask0','N.ask1','S0_request','C0_child','S1_started_written','C1_enter_run','C2_before_setns','C3_after_setns','C4_forked','C5_cgroups_written','G0_released','G1_creds_done','G2_landlock_done','G3_seccomp_done','C6_waited','S2_sigchld','S3_answered','N.started','S_release','N.exit','N.close','N.b']
def med(x): return statistics.median(x)/1e6
print('n',len(segs))
pairs=[('N.a','N.ask0'),('N.ask0','N.ask1'),('N.ask1','S0_request'),('S0_request','S1_started_written'),('S0_request','C0_child'),('C0_child','C1_enter_run'),('C1_enter_run','C2_before_setns'),('C2_before_setns','C3_after_setns'),('C3_after_setns','C4_forked'),('C4_forked','C5_cgroups_written'),('C5_cgroups_written','G0_released'),('G0_released','G1_creds_done'),('G1_creds_done','G2_landlock_done'),('G2_landlock_done','G3_seccomp_done'),('G3_seccomp_done','C6_waited'),('C6_waited','S2_sigchld'),('S2_sigchld','S3_answered'),('S3_answered','N.exit'),('S1_started_written','N.started'),('N.started','S_release'),('N.exit','N.close'),('N.close','N.b'),('N.a','N.b'),('S0_request','S3_answered')]
for a,b in pairs:
    d=[s[b]-s[a] for s in segs if a in s and b in s]
    if d: print(f'{a:>20} -> {b:<20} p50 {med(d):7.3f}  mean {statistics.mean(d)/1e6:7.3f} n={len(d)}')
