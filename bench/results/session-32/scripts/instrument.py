# Temporary timing probes in the built dist (never committed): rerun after each tsc build.
import sys
D=(sys.argv[1] if len(sys.argv)>1 else '/work/wt-session')+'/packages/dsec/dist/src/edge/backends'
def patch(p, pairs):
    s=open(p).read()
    if '__sessTrace' in s or '__procTrace' in s or '__noteTrace' in s: return
    for a,b in pairs:
        if a not in s: print('MISSING in', p, ':', a[:60]); continue
        s=s.replace(a,b,1)
    open(p,'w').write(s)
patch(f'{D}/shared/shell-session.js', [
("""        const started = performance.now();
""","""        const started = performance.now();
        const T = { received, started }; (globalThis.__sessTrace ??= []).push(T);
"""),
("""        const oomBefore = await this.#host.oomKills();
""","""        const oomBefore = await this.#host.oomKills();
        T.oomBefore = performance.now();
"""),
("""        this.#current = proc;
""","""        this.#current = proc;
        T.startShell = performance.now(); T.proc = proc;
"""),
("""            exitCode = await proc.exited;
""","""            proc.onOutput(() => { if (stdout.found && !T.outMarker) T.outMarker = performance.now(); if (stderr.found && !T.errMarker) T.errMarker = performance.now(); });
            proc.fd3Ended.then(() => T.fd3End = performance.now());
            proc.done.then(() => T.done = performance.now());
            exitCode = await proc.exited;
            T.exited = performance.now();
"""),
("""            exit = await Promise.race([proc.done, marked.then(() => undefined)]);
""","""            exit = await Promise.race([proc.done, marked.then(() => undefined)]);
            T.raced = performance.now();
"""),
("""        const oomAfter = await this.#host.oomKills();
""","""        const oomAfter = await this.#host.oomKills();
        T.end = performance.now();
"""),
])
patch(f'{D}/container/exec/sandbox-process.js', [
("constructor(target, spec, opts) {","constructor(target, spec, opts) {\n        const PT = { ctor: performance.now() }; (globalThis.__procTrace ??= []).push(PT); this.PT = PT;"),
("""        this.exited = new Promise((resolve) => {""","""        PT.ctorEnd = performance.now();
        child.once('spawn', () => PT.spawnEv = this.spawnEv = performance.now());
        child.once('exit', () => PT.exitEv = this.exitEv = performance.now());
        child.once('close', () => PT.closeEv = performance.now());
        this.exited = new Promise((resolve) => {"""),
])
patch(f'{D}/shared/session-table.js', [
("""        this.journal.note(noted);""","""        const __t = performance.now(); this.journal.note(noted); (globalThis.__noteTrace ??= []).push(performance.now() - __t);"""),
])
